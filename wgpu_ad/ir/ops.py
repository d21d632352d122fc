"""The whole op vocabulary of the IR on one screen.

The IR is scalar: vectors and matrices are unrolled by the frontend. Every table keyed by op
(WGSL spelling, reference semantics, derivative rules) must cover the groups below; tests check it.
"""
from __future__ import annotations

from enum import Enum, auto


class Op(Enum):
    # values
    CONST = auto()        # attr: Python value
    ARG = auto()          # attr: ArgSlot (a 4-byte scalar in the launch's uniform block)
    LOOP_INDEX = auto()   # attr: the Task (parallel index) or the RANGE_FOR stmt (serial)
    RANDOM = auto()       # uniform in [0, 1) for floats, any bits for ints; per-thread stream

    # unary
    NEG = auto(); ABS = auto(); SIGN = auto()
    SIN = auto(); COS = auto(); TAN = auto(); ASIN = auto(); ACOS = auto(); ATAN = auto()
    TANH = auto(); EXP = auto(); LOG = auto(); SQRT = auto(); RSQRT = auto()
    ASINH = auto(); ACOSH = auto(); ATANH = auto(); LOG1P = auto(); EXPM1 = auto()
    FLOOR = auto(); CEIL = auto(); ROUND = auto()
    NOT = auto()          # logical not of a u1
    BIT_NOT = auto()
    CAST = auto()         # value conversion to stmt.dtype
    BITCAST = auto()      # reinterpret bits as stmt.dtype

    # binary
    ADD = auto(); SUB = auto(); MUL = auto()
    DIV = auto()          # true division for floats; truncating division for ints (WGSL '/')
    FLOORDIV = auto()     # Python '//' (floor)
    MOD = auto()          # Python '%' (sign of the divisor)
    POW = auto(); ATAN2 = auto(); MIN = auto(); MAX = auto()
    BIT_AND = auto(); BIT_OR = auto(); BIT_XOR = auto(); SHL = auto(); SHR = auto()
    AND = auto(); OR = auto()  # logical, on u1 (both sides evaluated; frontend short-circuits with IF)
    LT = auto(); LE = auto(); GT = auto(); GE = auto(); EQ = auto(); NE = auto()

    # ternary
    SELECT = auto()       # args: cond, if_true, if_false

    # memory
    ALLOCA = auto()       # a thread-local variable of stmt.dtype; attr: name hint
    LOCAL_LOAD = auto()   # args: alloca
    LOCAL_STORE = auto()  # args: alloca, value
    GLOBAL_LOAD = auto()  # attr: Buffer; args: linear element index (i32)
    GLOBAL_STORE = auto() # attr: Buffer; args: index, value
    ATOMIC = auto()       # attr: (AtomicKind, Buffer); args: index, value; result: the old value
    STACK_ALLOC = auto()  # a thread-local stack of stmt.dtype; attr: capacity (int); autodiff only
    STACK_PUSH = auto()   # args: stack, value; overflow is reported through the error buffer
    STACK_POP = auto()    # args: stack; result: the popped value
    WG_SUM = auto()       # args: value; the sum over the workgroup (task epilogues only, uniform control flow)
    WG_LEADER = auto()    # u1: true in one thread of each workgroup (task epilogues only)

    # control flow (nested blocks)
    IF = auto()           # args: cond; blocks: then, else
    RANGE_FOR = auto()    # args: begin, end; blocks: body; serial loop, index via LOOP_INDEX
    WHILE = auto()        # blocks: body; runs until a BREAK
    BREAK = auto()
    CONTINUE = auto()
    RETURN = auto()       # args: value; the kernel's return value
    ASSERT = auto()       # args: cond, *values; attr: message template with {} for the values

    # output
    PRINT = auto()        # args: the values of one print() line; attr: plan.Print (its text and formats)


class AtomicKind(Enum):
    ADD = "add"; SUB = "sub"; MIN = "min"; MAX = "max"; AND = "and"; OR = "or"; XOR = "xor"


class GroupOp:
    Unary = frozenset({Op.NEG, Op.ABS, Op.SIGN, Op.SIN, Op.COS, Op.TAN, Op.ASIN, Op.ACOS, Op.ATAN,
                       Op.TANH, Op.EXP, Op.LOG, Op.SQRT, Op.RSQRT, Op.FLOOR, Op.CEIL, Op.ROUND,
                       Op.ASINH, Op.ACOSH, Op.ATANH, Op.LOG1P, Op.EXPM1,
                       Op.NOT, Op.BIT_NOT, Op.CAST, Op.BITCAST})
    Comparison = frozenset({Op.LT, Op.LE, Op.GT, Op.GE, Op.EQ, Op.NE})
    Binary = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.FLOORDIV, Op.MOD, Op.POW, Op.ATAN2,
                        Op.MIN, Op.MAX, Op.BIT_AND, Op.BIT_OR, Op.BIT_XOR, Op.SHL, Op.SHR,
                        Op.AND, Op.OR}) | Comparison
    Ternary = frozenset({Op.SELECT})
    ALU = Unary | Binary | Ternary
    Commutative = frozenset({Op.ADD, Op.MUL, Op.MIN, Op.MAX, Op.BIT_AND, Op.BIT_OR, Op.BIT_XOR,
                             Op.AND, Op.OR, Op.EQ, Op.NE})
    FloatOnly = frozenset({Op.SIN, Op.COS, Op.TAN, Op.ASIN, Op.ACOS, Op.ATAN, Op.TANH, Op.EXP,
                           Op.ASINH, Op.ACOSH, Op.ATANH, Op.LOG1P, Op.EXPM1,
                           Op.LOG, Op.SQRT, Op.RSQRT, Op.FLOOR, Op.CEIL, Op.ROUND, Op.POW,
                           Op.ATAN2})
    # the costly float functions: transpose.py weighs them; symmetry.py models those it lists
    Transcendental = frozenset({Op.SIN, Op.COS, Op.TAN, Op.ASIN, Op.ACOS, Op.ATAN, Op.TANH, Op.EXP,
                                Op.LOG, Op.POW, Op.ATAN2, Op.ASINH, Op.ACOSH, Op.ATANH, Op.LOG1P,
                                Op.EXPM1})
    IntOnly = frozenset({Op.BIT_NOT, Op.BIT_AND, Op.BIT_OR, Op.BIT_XOR, Op.SHL, Op.SHR})
    Memory = frozenset({Op.ALLOCA, Op.LOCAL_LOAD, Op.LOCAL_STORE, Op.GLOBAL_LOAD, Op.GLOBAL_STORE,
                        Op.ATOMIC, Op.STACK_ALLOC, Op.STACK_PUSH, Op.STACK_POP})
    Control = frozenset({Op.IF, Op.RANGE_FOR, Op.WHILE, Op.BREAK, Op.CONTINUE, Op.RETURN,
                         Op.ASSERT})
    # ops with effects: never CSE'd, never removed as dead code
    SideEffect = frozenset({Op.LOCAL_STORE, Op.GLOBAL_STORE, Op.ATOMIC, Op.RANDOM, Op.STACK_ALLOC,
                            Op.STACK_PUSH, Op.STACK_POP, Op.WG_SUM, Op.WG_LEADER, Op.PRINT}) | Control
    # gradient stops here (integer- or boolean-valued, or piecewise constant)
    NotDifferentiable = frozenset({Op.SIGN, Op.FLOOR, Op.CEIL, Op.ROUND, Op.NOT, Op.BIT_NOT,
                                   Op.BITCAST, Op.FLOORDIV, Op.BIT_AND, Op.BIT_OR, Op.BIT_XOR,
                                   Op.SHL, Op.SHR, Op.AND, Op.OR, Op.RANDOM}) | Comparison
