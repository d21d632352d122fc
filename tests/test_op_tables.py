"""Every table keyed by op decides every op of its group: each op is in the table or in the named
set next to it that leaves it out on purpose, so a new op fails here, naming the table to edit.
Where a table's entries can be checked against an independent answer (ir/semantics.py, the IR a
value lowers to), that is checked too. No GPU needed.
"""
from __future__ import annotations

import math
import operator
import re

import numpy as np
import pytest

from wgpu_ad.errors import CompileError
from wgpu_ad.frontend import builtins as B
from wgpu_ad.frontend import values as V
from wgpu_ad.ir.builder import Builder
from wgpu_ad.ir.nodes import ArgSlot, Stmt
from wgpu_ad.ir.ops import GroupOp, Op
from wgpu_ad.ir.semantics import evaluate
from wgpu_ad.passes.autodiff import forward, rules, symmetry, transpose
from wgpu_ad.types import f32, i32, u1


def undecided(group, *tables: tuple[str, object]) -> list[str]:
    """Messages for the ops of `group` in none of the named tables (name, set or dict)."""
    names = " nor ".join(n for n, _ in tables)
    return [f"Op.{op.name} is in neither {names}: decide it" for op in sorted(group, key=lambda o: o.name)
            if not any(op in t for _, t in tables)]


def overlapping(*tables: tuple[str, object]) -> list[str]:
    out = []
    for k, (na, a) in enumerate(tables):
        for nb, b in tables[k + 1:]:
            out += [f"Op.{op.name} is in both {na} and {nb}" for op in sorted(set(a) & set(b), key=lambda o: o.name)]
    return out


def check(group, *tables: tuple[str, object]) -> None:
    problems = undecided(group, *tables) + overlapping(*tables)
    assert not problems, "\n".join(problems)


def test_the_check_names_the_missing_op_and_the_tables():
    problems = undecided({Op.ADD, Op.SUB}, ("t._A", {Op.ADD}), ("t._B", set()))
    assert problems == ["Op.SUB is in neither t._A nor t._B: decide it"]
    assert overlapping(("t._A", {Op.ADD}), ("t._B", {Op.ADD})) == ["Op.ADD is in both t._A and t._B"]


# ---- frontend/fold.py: compile-time constants, folded with ir/semantics.py ------------------

# Python's own meaning of each op on Python numbers: the independent reference of the folding
_PY = {
    Op.NEG: operator.neg, Op.ABS: abs, Op.NOT: operator.not_, Op.BIT_NOT: operator.invert,
    Op.SIGN: lambda x: type(x)((x > 0) - (x < 0)), Op.SIN: math.sin, Op.COS: math.cos, Op.TAN: math.tan,
    Op.ASIN: math.asin, Op.ACOS: math.acos, Op.ATAN: math.atan, Op.TANH: math.tanh, Op.EXP: math.exp,
    Op.LOG: math.log, Op.SQRT: math.sqrt, Op.RSQRT: lambda x: 1 / math.sqrt(x), Op.FLOOR: math.floor,
    Op.CEIL: math.ceil, Op.ROUND: round, Op.ASINH: math.asinh, Op.ACOSH: math.acosh, Op.ATANH: math.atanh,
    Op.LOG1P: math.log1p, Op.EXPM1: math.expm1,
    Op.ADD: operator.add, Op.SUB: operator.sub, Op.MUL: operator.mul, Op.DIV: operator.truediv,
    Op.FLOORDIV: operator.floordiv, Op.MOD: operator.mod, Op.POW: operator.pow, Op.ATAN2: math.atan2,
    # ti.min(1, 2.5) is a float, of the promoted type (Python's min returns one of its arguments)
    Op.MIN: lambda a, b: type(a + b)(min(a, b)), Op.MAX: lambda a, b: type(a + b)(max(a, b)), Op.BIT_AND: operator.and_, Op.BIT_OR: operator.or_, Op.BIT_XOR: operator.xor,
    Op.SHL: operator.lshift, Op.SHR: operator.rshift, Op.AND: lambda a, b: bool(a and b),
    Op.OR: lambda a, b: bool(a or b), Op.LT: operator.lt, Op.LE: operator.le, Op.GT: operator.gt,
    Op.GE: operator.ge, Op.EQ: operator.eq, Op.NE: operator.ne,
}
# not folded by Ops.unary / Ops.binary: conversions go through Ops.cast, a select through Ops.select
_NOT_FOLDED = frozenset({Op.CAST, Op.BITCAST, Op.SELECT})


def test_the_folding_reference_decides_every_alu_op():
    check(GroupOp.ALU, ("test_op_tables._PY", _PY), ("test_op_tables._NOT_FOLDED", _NOT_FOLDED))


def _fold_samples(op: Op) -> list[tuple]:
    if op in (Op.NOT, Op.AND, Op.OR):
        return [(True,), (False,)] if op is Op.NOT else [(True, False), (3, 0), (2, 5)]
    if op in GroupOp.IntOnly:
        return [(-6,), (13,)] if op in GroupOp.Unary else [(13, 3), (-13, 5), (1, 40), (True, 3)]
    if op in GroupOp.Unary:
        xs = [0.7, -0.35, 3, 2.5, 1e-9]
        if op in (Op.ASIN, Op.ACOS, Op.ATANH):
            return [(x,) for x in xs if abs(x) < 1]
        return [(x,) for x in xs if x >= {Op.LOG: 0, Op.SQRT: 0, Op.RSQRT: 0, Op.ACOSH: 1}.get(op, -1)]
    neg = (-2.5, 2.0) if op is Op.POW else (-2.5, 1.5)  # (Python's (-2.5) ** 1.5 is complex: refused)
    return [(0.7, 0.4), neg, (7, 2), (-7, 2), (2, -2), (2, 10), (True, 2)]


@pytest.mark.parametrize("op", sorted(set(_PY), key=lambda o: o.name), ids=lambda o: o.name)
def test_folding_is_what_python_computes(op):
    """A Python value folded with the IR's semantics is Python's number, of Python's type."""
    for xs in _fold_samples(op):
        got, want = V.Ops(Builder()).unary(op, *xs) if len(xs) == 1 else V.Ops(Builder()).binary(op, *xs), _PY[op](*xs)
        assert type(got) is type(want), f"Op.{op.name}{xs}: {got!r} is a {type(got).__name__}, Python gives {want!r}"
        assert got == pytest.approx(want, rel=1e-15, abs=0), f"Op.{op.name}{xs}: folded {got!r}, Python gives {want!r}"


def test_folding_errors_are_python_s():
    ops = V.Ops(Builder())
    for op, xs, text in [(Op.DIV, (1.0, 0.0), "division by zero"), (Op.MOD, (5, 0), "division by zero"),
                         (Op.LOG, (0.0,), "(math domain error)"), (Op.SQRT, (-1.0,), "(math domain error)"),
                         (Op.EXP, (1000.0,), "(math range error)"), (Op.POW, (10.0, 400.0), "(math range error)"),
                         (Op.POW, (-2.5, 1.5), "(math domain error)")]:
        with pytest.raises(CompileError, match=re.escape(text)):
            ops.unary(op, *xs) if len(xs) == 1 else ops.binary(op, *xs)


@pytest.mark.parametrize("op", sorted(GroupOp.Unary - {Op.CAST, Op.BITCAST, Op.NOT}, key=lambda o: o.name),
                         ids=lambda o: o.name)
def test_float_only_unary_ops_convert_an_integer_to_f32(op):
    b = Builder()
    x = b.emit(Op.ARG, (), i32, ArgSlot("x", i32, 0))
    r = V.Ops(b).unary(op, x)
    assert r.op is op
    if op in GroupOp.FloatOnly:
        assert (r.args[0].op, r.args[0].dtype, r.dtype) == (Op.CAST, f32, f32), f"Op.{op.name} on an i32"
    else:
        assert r.args[0] is x and r.dtype == i32, f"Op.{op.name} on an i32"


# ---- frontend/builtins.py: Python functions called in kernels -------------------------------

def test_py_functions_decide_every_alu_op():
    check(GroupOp.ALU, ("builtins._PY_FUNCTIONS", B._PY_FUNCTIONS), ("builtins._NO_PY_FUNCTION", B._NO_PY_FUNCTION))


_PY_FUNCTION_CASES = [(op, f) for op, (_, fs) in sorted(B._PY_FUNCTIONS.items(), key=lambda kv: kv[0].name)
                      for f in fs]


@pytest.mark.parametrize("op, f", _PY_FUNCTION_CASES, ids=[f"{op.name}-{f.__module__}.{f.__name__}"
                                                          for op, f in _PY_FUNCTION_CASES])
def test_py_function_computes_its_op_and_lowers_to_it(op, f):
    builtin, _ = B._PY_FUNCTIONS[op]
    assert B.PY_BUILTINS[f] is builtin
    args = (0.7, 0.4) if op in GroupOp.Binary else (1.7,) if op is Op.ACOSH else (0.7,)
    want = evaluate(op, f32, *(np.float32(a) for a in args))
    assert f(*args) == pytest.approx(float(want), rel=1e-6), f"{f.__name__} is not Op.{op.name}"
    b = Builder()
    xs = [b.emit(Op.ARG, (), f32, ArgSlot(f"x{k}", f32, k)) for k in range(len(args))]
    r = builtin.lower(V.Ops(b), *xs)
    assert r.op is op and r.args == xs, f"{f.__name__} lowers to Op.{r.op.name}, not Op.{op.name}"


def test_py_builtins_is_the_python_functions_of_the_table():
    assert {id(f) for f in B.PY_BUILTINS} == {id(f) for _, fs in B._PY_FUNCTIONS.values() for f in fs}
    assert math.pow in B.PY_BUILTINS and abs in B.PY_BUILTINS


# ---- passes/autodiff/rules.py: one derivative table for both modes; forward.py: the other ops ---

_DERIVATIVES = (("rules.PARTIALS", rules.PARTIALS), ("rules.OWN_RULES", rules.OWN_RULES), ("rules.ZERO", rules.ZERO))


def test_every_alu_op_has_partials_own_rules_or_a_zero_derivative():
    check(GroupOp.ALU, *_DERIVATIVES)


def test_forward_mode_decides_every_op():
    check(Op, ("rules.PARTIALS", rules.PARTIALS), ("rules.OWN_RULES", rules.OWN_RULES),
          ("rules.ZERO", rules.ZERO - {Op.RANDOM}), ("forward.CONTROL", forward.CONTROL),
          ("forward.CONSTANT", forward.CONSTANT), ("forward.MEMORY", forward.MEMORY),
          ("forward.NOT_IN_INPUT", forward.NOT_IN_INPUT))


def test_hand_written_rules_say_why():
    for op, own in rules.OWN_RULES.items():
        assert len(own.why) > 5, f"rules.OWN_RULES[Op.{op.name}] gives no reason"


# ---- passes/autodiff/transpose.py: the cost of a pair loop's body ---------------------------

def test_transpose_weight_decides_every_op():
    check(Op, ("transpose._WEIGHT", transpose._WEIGHT), ("transpose._WEIGHT_ONE", transpose._WEIGHT_ONE),
          ("transpose._UNWEIGHTED", transpose._UNWEIGHTED), ("transpose._REFUSED_IN_LOOP", transpose._REFUSED_IN_LOOP))


def test_transpose_cost_of_each_kind_of_op():
    cost = transpose._COST
    assert (cost[Op.SIN], cost[Op.DIV], cost[Op.GLOBAL_LOAD], cost[Op.ADD], cost[Op.ATOMIC], cost[Op.CONST]) == \
        (20, 4, 2, 1, 1, 0)
    assert set(cost) == set(Op) - transpose._REFUSED_IN_LOOP


# ---- passes/autodiff/symmetry.py: which ops a symmetry proof models --------------------------

_SYMMETRY_TABLES = (("symmetry._SMOOTH", symmetry._SMOOTH), ("symmetry._OWN_RULE", symmetry._OWN_RULE),
                    ("symmetry._NOT_SMOOTH", symmetry._NOT_SMOOTH), ("symmetry._NOT_MODELLED", symmetry._NOT_MODELLED))


def test_symmetry_decides_every_alu_op():
    check(GroupOp.ALU, *_SYMMETRY_TABLES)


def _form_of(op: Op):
    """The canonical form of `op` applied to arguments (CAST: of an i32 one, SELECT: on a u1)."""
    arity = 1 if op in GroupOp.Unary else 3 if op in GroupOp.Ternary else 2
    dts = [i32] if op is Op.CAST else [u1, f32, f32] if op is Op.SELECT else [f32] * arity
    args = [Stmt(Op.ARG, dt, attr=ArgSlot(f"x{k}", dt, k)) for k, dt in enumerate(dts)]
    dtype = u1 if op in GroupOp.Comparison or op in (Op.AND, Op.OR, Op.NOT) else f32
    return symmetry._Forms(None, None).of(Stmt(op, dtype, args))


@pytest.mark.parametrize("op", sorted(GroupOp.ALU, key=lambda o: o.name), ids=lambda o: o.name)
def test_symmetry_models_exactly_the_smooth_ops_and_own_rules(op):
    if op in symmetry._SMOOTH | symmetry._OWN_RULE:
        assert _form_of(op), f"Op.{op.name} has no canonical form"
    else:
        with pytest.raises(symmetry._NotProven):
            _form_of(op)


# ---- every table an ALU op needs, named where it is missing ----------------------------------

def tables_missing(op: Op) -> list[str]:
    """The tables ALU op `op` is missing from: the IR's, the compiler's, the public names and the
    tests' references (adding an op is one entry in each)."""
    import wgpu_ad as ti
    from reference import NUMPY_REF
    from wgpu_ad.codegen.ops_table import ALU
    from wgpu_ad.ir.semantics import SEMANTICS
    out = []
    if op not in GroupOp.Unary | GroupOp.Binary | GroupOp.Ternary:
        out.append("ir/ops.py GroupOp.Unary / Binary / Ternary (its arity)")
    if op not in SEMANTICS:
        out.append("ir/semantics.py SEMANTICS")
    if op not in ALU:
        out.append("codegen/ops_table.py ALU (its WGSL spelling)")
    if not any(op in t for _, t in _DERIVATIVES):
        out.append("passes/autodiff/rules.py PARTIALS (or OWN_RULES, or ZERO)")
    if op not in B._PY_FUNCTIONS and op not in B._NO_PY_FUNCTION:
        out.append("frontend/builtins.py _PY_FUNCTIONS (its ti.* function; or _NO_PY_FUNCTION)")
    elif op in B._PY_FUNCTIONS:
        fn = B._PY_FUNCTIONS[op][0]
        if getattr(ti, fn.name, None) is not fn:
            out.append(f"wgpu_ad/__init__.py (ti.{fn.name}: it exports builtins.op_functions())")
        if op in GroupOp.FloatOnly and getattr(ti.math, fn.name, None) is not fn:
            out.append(f"lang/mathlib.py (ti.math.{fn.name}: it exports builtins.op_functions())")
    if op not in NUMPY_REF and op not in (Op.CAST, Op.BITCAST):
        out.append("tests/reference.py NUMPY_REF")
    if op not in _PY and op not in _NOT_FOLDED:
        out.append("tests/test_op_tables.py _PY (Python's meaning, for the folding)")
    return out


@pytest.mark.parametrize("op", sorted(GroupOp.ALU, key=lambda o: o.name), ids=lambda o: o.name)
def test_every_alu_op_is_in_every_table(op):
    missing = tables_missing(op)
    assert not missing, f"Op.{op.name} is missing from: " + "; ".join(missing)


def test_a_missing_entry_is_named(monkeypatch):
    from reference import NUMPY_REF, numpy_ref
    from wgpu_ad.codegen import ops_table
    from wgpu_ad.ir import semantics
    monkeypatch.delitem(semantics.SEMANTICS, Op.ASINH)
    monkeypatch.delitem(ops_table.ALU, Op.ASINH)
    monkeypatch.delitem(rules.PARTIALS, Op.ASINH)
    monkeypatch.delitem(NUMPY_REF, Op.ASINH)
    assert tables_missing(Op.ASINH) == ["ir/semantics.py SEMANTICS", "codegen/ops_table.py ALU (its WGSL spelling)",
                                        "passes/autodiff/rules.py PARTIALS (or OWN_RULES, or ZERO)",
                                        "tests/reference.py NUMPY_REF"]
    with pytest.raises(KeyError, match="Op.ASINH has no NumPy reference: add it to NUMPY_REF in tests/reference.py"):
        numpy_ref(Op.ASINH)
