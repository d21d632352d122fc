"""Random wgpu_ad programs for tests/test_fuzz.py: seeded, race-free by construction, well
conditioned, written as Python source text.

`generate(seed)` returns a `Program`: the source of a module defining `build(ti)`, which creates
the fields, @ti.func helpers and kernels of the program and returns them with the launches to make
in order. The same text runs under wgpu_ad (`build(wgpu_ad)`) and under the float64 shim of
fuzz_shim.py (`build(fuzz_shim)`), which is the reference. `python tests/fuzz_gen.py SEED` prints
one program.

What a program has: scalar inputs a, b (n,), a vector field v (n, 2), a 2-D field m (n, n), a 0-d
w, an i32 field cnt (trip counts 0..3), temporaries the kernels create, and the loss. Seeded
choices add, each to about a third of the programs:
  * matrices: a ti.Matrix.field M (n,) of 2x2 and 2x2 matrix temporaries; 2x2 and 3x3 locals
    (ti.Matrix([[...]]) of expressions, outer products, entries assigned after `A[r, c] = ...`,
    a matrix carried through a serial loop), `@` (matrix @ matrix, matrix @ vector, vector @
    matrix), .transpose(), elementwise + - * and scaling, and the scalars .trace(),
    .determinant(), .norm(eps), .norm_sqr(), A[r, c] (also at an index computed on the GPU);
    matrix stores, `+=` of a matrix or of one entry (`M[j][r, c] += ...`);
  * ndarrays: inputs na (n,) and nv (n, 2) made by ti.ndarray(..., needs_grad=True), and some
    temporaries, passed to the kernels that use them as `ti.types.ndarray()` arguments, so their
    gradients come from the ndarray paths of reverse mode.
  * indices read from data: an i32 permutation perm, read through (`a[perm[i]]`) and stored
    through (`P[perm[i]] = ...` into a fresh temporary), which the launch checks at run time;
  * a 3-D input q (n, 3, 2), read at computed indices (`q[i % n, k % 3, i % 2]`).
Each kernel may also get, with a field of its own: top-level code before its loop that reads a
0-d field G and then overwrites it (`G = e * G + e'`, or `G += e; G *= e'`: Taichi's data-access
rules #1 and #2, one thread run once), which the loop may read; a recurrence
`R[t + 1, i] = f(R[t, i])` over a serial loop t, stored under an equality on an inner loop's index
(`for jj in range(2): if jj == t % 2:`: once per step, at a computed index); ti.atomic_max /
atomic_min into the thread's own element of a fresh X (maybe in a serial loop). A kernel with an
argument is sometimes launched twice, with different values; a field a kernel uses is sometimes
passed to it as a ti.template() argument (the parameter has the field's name).
Kernels are parallel loops over range(n), a field, or pairs `ti.ndrange(n, n)` (or a 2-D field),
and kernel-scope reductions `s = 0.0; for i in ...: s += ...`. Their bodies mix locals, vector
and matrix locals, serial loops with mutable locals (constant, field-read or static trip counts;
`while`; `break` / `continue` on data), if/elif/else on data, helper calls, swizzles (`u.yx`),
indices `i % n` and `(i + 1) % n`, and writes: stores to fresh
temporaries (a 1-D loop stores T[i] of a (n,) temporary, a pair loop T[i, j] of a fresh (n, n)
one that later kernels read), in-place updates `x[i] = f(x[i])` and `x[i, j] = f(x[i, j])` (also
in serial loops, also only in some iterations: under `if k == c` or a condition on data), and
`+=`, `-=`, ti.atomic_add / atomic_sub into any field the kernel does not read; stencil reads of
fields the kernel does not write at the parallel index plus a constant offset under a bounds check
(`if 0 <= i + 1 < n: ... a[i + 1]`), whose adjoints are scatters or gathers. The last kernel
reads every element of every float field into the loss.

Gradients stopped on purpose, and checkpoints (drawn from an RNG of their own, so that they
change little else of a program): in about two fifths of the programs some scalar, vector and
matrix expressions are wrapped in ti.stop_grad(...); a kernel sometimes starts its loop with
ti.stop_grad(x) for a field x the loop reads and the kernel does not write; a kernel is sometimes
@ti.ad.no_grad (one that only accumulates more often than one that overwrites, whose last stores
are then sometimes under a condition on data; none with atomic max / min; one reads what it
overwrites only in that element's own store and in conditions: see kernel()); and a kernel
launched once, returning nothing, sometimes becomes the step of
ti.ad.checkpoint(step, 2 or 3, [every field it writes but the loss], None, schedule). The
shim's central differences hold what is stopped at its unperturbed value (fuzz_shim.py says how).
A `while` loop's condition sometimes has a condition on data too (`while k < 3 and e < c:`).
tests/test_fuzz_features.py counts each of these over the seeds CI runs.

Why it is race-free: a store writes the element of the iteration's own index ([i] in a 1-D loop,
[i, j] in a pair loop), and the kernel reads that field only there; a field a kernel accumulates
into with += is not read by it; a field written by a shape of its own (R, P, X) is read by nothing
else in that kernel, and what a kernel reads is written by no later kernel (a kernel launched
twice does not read in its loop the 0-d field its top level overwrites).
Why it is well conditioned: inputs are in [-1, 1]; division is by 1 + e*e or 2 + sin(e); sqrt and
log take 1 + e*e or 2 + cos(e); exp takes tanh(e); serial recurrences contract (factor 1/2), and
so does a product of matrix expressions (`A @ B * 0.5`).
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

import numpy as np

FLOAT_INPUTS = {"a": "s", "b": "s", "v": "v", "m": "m", "w": "0"}   # name -> kind
# kinds: "s" (n,) scalars, "v" (n,) vec2, "M" (n,) 2x2 matrices, "m" (n, n) scalars, "0" a 0-d scalar,
# "c" (n, 3, 2) scalars (a 3-D field)
LOSS_FIELDS = 10   # fields per loss kernel
SHAPES = {"s": lambda n: (n,), "v": lambda n: (n, 2), "M": lambda n: (n, 2, 2), "m": lambda n: (n, n),
          "0": lambda n: (), "c": lambda n: (n, 3, 2)}


@dataclass
class Program:
    seed: int
    n: int
    source: str
    float_fields: dict[str, tuple]   # name -> full array shape (element dims included)
    int_fields: dict[str, tuple]

    @classmethod
    def from_source(cls, source: str, seed: int = 0) -> "Program":
        """A program written by hand in the same form (build(ti) -> fields, launches): its
        fields' shapes are read off a float64 run of build()."""
        import fuzz_shim
        fields, _ = fuzz_shim.run_module(source)["build"](fuzz_shim)
        floats = {k: f.to_numpy().shape for k, f in fields.items() if f.dtype != fuzz_shim.i32 and k != "loss"}
        ints = {k: f.to_numpy().shape for k, f in fields.items() if f.dtype == fuzz_shim.i32}
        n = max((s[0] for s in floats.values() if s), default=1)
        return cls(seed, n, source, floats, ints)

    def inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Initial values: floats in [-1, 1] (the loss starts at 0), trip counts in 0..3."""
        # float32 values, so that both sides start from the same numbers
        out = {name: rng.uniform(-1.0, 1.0, shape).astype(np.float32).astype(np.float64)
               for name, shape in self.float_fields.items()}
        out["loss"] = np.zeros(())
        for name, shape in self.int_fields.items():
            # perm: a permutation (indices read from data: stores through it meet the run-time checks)
            out[name] = rng.permutation(shape[0]) if name == "perm" else rng.integers(0, 4, shape)
        return out


@dataclass
class _Kernel:
    """What the kernel being written may touch."""
    stored: dict = field(default_factory=dict)     # field -> the index it is stored at ("i")
    added: set = field(default_factory=set)        # fields accumulated with +=: never read here
    loop: str = "map"                              # "map", "pair" or "reduce"
    own: str = "i"                                 # the index a stored field is stored and read at
    args: list = field(default_factory=list)
    reads: set = field(default_factory=set)        # fields read
    flat: bool = False                             # no serial loops: a stencil's body (gatherable adjoint)
    hidden: set = field(default_factory=set)       # written by a shape of their own: read by nothing else here
    sealed: set = field(default_factory=set)       # a no_grad kernel's overwritten fields: read in conditions only


class _Scope:
    def __init__(self, idx):
        self.idx = list(idx)          # parallel indices in scope: ["i"] or ["i", "j"]
        self.scalars: list[str] = []  # float locals
        self.vectors: list[str] = []  # vec2 locals
        self.counters: list[str] = []  # serial loop counters below 3 (so below n): valid indices
        self.ints: list[str] = []      # other integer locals (while-loop counters)
        self.mats: list[tuple[str, int]] = []  # matrix locals: (name, size), 2x2 or 3x3

    def child(self) -> "_Scope":
        s = _Scope(self.idx)
        s.scalars, s.vectors, s.mats = list(self.scalars), list(self.vectors), list(self.mats)
        s.counters, s.ints = list(self.counters), list(self.ints)
        return s


class Generator:
    def __init__(self, seed: int):
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.trng = np.random.default_rng(seed + 7 * 10**6)  # template arguments (signature)
        # gradients stopped on purpose and checkpoints: an RNG of their own too
        self.frng = np.random.default_rng(seed + 11 * 10**6)
        self.stops = self.frng.random() < 0.4   # ti.stop_grad(value) in expressions
        self.n = int(self.rng.integers(3, 7))
        self.kinds = dict(FLOAT_INPUTS)   # every float field -> "s" | "v" | "M" | "m" | "0"
        self.nd: set[str] = set()         # which of them are ndarrays (kernel arguments)
        self.matrices = self.chance(0.35)  # matrix locals, a Matrix field M, matrix temporaries
        self.ndarrays = self.chance(0.35)  # ndarray inputs na (and nv), some ndarray temporaries
        self.data_indices = self.chance(0.25)  # an i32 permutation perm: reads and stores through perm[i]
        self.cube = self.chance(0.3)       # a 3-D input q (n, 3, 2)
        self.out: list[str] = []          # lines of build()'s body
        self.launches: list[str] = []
        self.helpers: list[tuple[str, str]] = []   # (name, signature kind)
        self.names = 0
        self.k: _Kernel | None = None
        self.read_before: set[str] = set()  # fields earlier kernels read: later ones do not write them

    # ---- small helpers ---------------------------------------------------------------------
    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def pick(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def const(self, lo=-0.9, hi=0.9) -> str:
        return f"{self.rng.uniform(lo, hi):.2f}"

    def fresh(self, prefix: str) -> str:
        self.names += 1
        return f"{prefix}{self.names}"

    def emit(self, depth: int, text: str) -> None:
        self.out.append("    " * depth + text)

    # ---- expressions ---------------------------------------------------------------------------
    def readable(self, name: str) -> bool:
        return name not in self.k.added and name != "loss" and name not in self.k.hidden

    def field_leaf(self, sc: _Scope) -> str | None:
        """A scalar read of some field at an index valid here, or None."""
        opts = []
        for name, kind in self.kinds.items():
            if not self.readable(name):
                continue
            comp = self.pick(["[0]", "[1]", ".x", ".y"]) if kind == "v" else self.mcomp() if kind == "M" else ""
            if name in self.k.stored:           # stored in this kernel: its own element only
                own = self.k.own if self.k.own != "i" or self.chance(0.7) else f"i % {self.n}"  # folds to i
                opts.append((name, f"{name}[{own}]{comp}"))
                continue
            ix = self.index(sc)
            if kind in ("s", "v", "M"):
                opts.append((name, f"{name}[{ix}]{comp}"))
            elif kind == "c":
                c1 = self.pick(["0", "1", "2"] + [f"{k} % 3" for k in sc.counters])
                c2 = self.pick(["0", "1"] + [f"{k} % 2" for k in sc.counters + sc.idx])
                opts.append((name, f"{name}[{ix}, {c1}, {c2}]"))
            elif kind == "m":
                opts.append((name, f"{name}[{ix}, {self.index(sc)}]"))
            else:
                opts.append((name, f"{name}[None]"))
        if not opts:
            return None
        name, text = self.pick(opts)
        self.k.reads.add(name)
        return text

    def mcomp(self, size: int = 2) -> str:
        return f"[{int(self.rng.integers(size))}, {int(self.rng.integers(size))}]"

    def index(self, sc: _Scope) -> str:
        opts = list(sc.idx) + [f"({sc.idx[0]} + 1) % {self.n}", f"{self.n - 1} - {sc.idx[-1]}",
                               f"{sc.idx[0]} % {self.n}"]
        opts += sc.counters  # counters stay below 3 <= n
        if self.data_indices:
            opts.append(f"perm[{sc.idx[0]}]")  # an index read from data
        return self.pick(opts)

    def leaf(self, sc: _Scope) -> str:
        r = self.rng.random()
        if r < 0.5:
            f = self.field_leaf(sc)
            if f is not None:
                return f
        if r < 0.75 and sc.scalars:
            return self.pick(sc.scalars)
        if r < 0.85:
            ints = sc.idx + sc.counters + sc.ints
            # a third decimal 3: i * c (i < 10) never equals a two-decimal constant it is compared
            # with (3 * 0.27 is 0.81 in float64 but 0.81000006 in float32: fuzz seed 2930)
            return f"{self.pick(ints)} * {float(self.const(0.1, 0.4)) + 0.003:.3f}"
        if r < 0.92 and self.k.args:
            return self.pick(self.k.args)
        return self.const()

    def expr(self, sc: _Scope, d: int = 3) -> str:
        e = self.expr_of(sc, d)
        if self.stops and d > 0 and self.frng.random() < 0.03:
            return f"ti.stop_grad({e})"  # a constant for the gradient: the shim holds it fixed
        return e

    def expr_of(self, sc: _Scope, d: int) -> str:
        if d <= 0 or self.chance(0.25):
            return self.leaf(sc)
        e = lambda: self.expr(sc, d - 1)  # noqa: E731
        r = int(self.rng.integers(20 if self.matrices else 18))
        if r <= 3:
            return f"({e()} {self.pick(['+', '-', '*', '+'])} {e()})"
        if r == 4:
            x = e()
            return self.pick([f"({e()} / (1.0 + {x} * {x}))", f"({e()} / (2.0 + ti.sin({x})))"])
        if r == 5:
            return f"ti.{self.pick(['sin', 'cos', 'tanh'])}({e()})"
        if r == 6:
            return f"ti.exp(ti.tanh({e()}))"
        if r == 7:
            x = e()
            return self.pick([f"ti.sqrt(1.0 + {x} * {x})", f"ti.log(2.0 + ti.cos({x}))",
                              f"ti.log(1.0 + {x} * {x})"])
        if r == 8:
            return self.pick([f"{e()} ** 2", f"ti.tanh({e()}) ** 3"])
        if r == 9:
            return f"ti.{self.pick(['max', 'min'])}({e()}, {e()})"
        if r == 10:
            return f"ti.abs({e()})"
        if r == 11:
            return f"ti.atan2({e()}, 1.5 + ti.cos({e()}))"
        if r == 12:
            op = self.pick(["<", ">"])
            return self.pick([f"({e()} if {e()} {op} {self.const()} else {e()})",
                              f"ti.select({e()} {op} {self.const()}, {e()}, {e()})"])
        if r == 13 and self.helpers:
            name, sig = self.pick(self.helpers)
            if sig == "ss":
                return f"{name}({e()}, {e()})"
            if sig == "s":
                return f"{name}({e()})"
            return f"{name}({self.vexpr(sc, d - 1)}, {e()}){self.pick(['[0]', '.y'])}"
        if r in (14, 15):
            u = self.vexpr(sc, d - 1)
            return self.pick([f"{u}.dot({self.vexpr(sc, d - 1)})", f"{u}.norm()", f"{u}.norm(0.01)",
                              f"{u}[{self.pick(['0', '1'])}]", f"{u}.normalized(0.01).x"])
        if r >= 18:
            return self.mscalar(sc, min(d - 1, 1))
        return f"(-{e()})" if r == 16 else f"{self.const(0.2, 0.9)} * {e()}"

    def vleaf(self, sc: _Scope) -> str:
        opts = [(None, u) for u in sc.vectors]
        for name, kind in self.kinds.items():
            if kind == "v" and self.readable(name):
                opts.append((name, f"{name}[{self.k.own}]" if name in self.k.stored else f"{name}[{self.index(sc)}]"))
        if opts and self.chance(0.7):
            name, text = self.pick(opts)
            if name is not None:
                self.k.reads.add(name)
            return text
        return f"ti.Vector([{self.leaf(sc)}, {self.leaf(sc)}])"

    def vexpr(self, sc: _Scope, d: int = 2) -> str:
        u = self.vexpr_of(sc, d)
        if self.stops and d > 0 and self.frng.random() < 0.03:
            return f"ti.stop_grad({u})"  # a vector held fixed
        return u

    def vexpr_of(self, sc: _Scope, d: int) -> str:
        if d <= 0 or self.chance(0.4):
            return self.vleaf(sc)
        r = int(self.rng.integers(5 if self.matrices else 4))
        if r == 4:  # matrix @ vector, or vector @ matrix (a row vector)
            u, a = self.vexpr(sc, d - 1), self.mexpr(sc, 2, d - 1)
            return self.pick([f"({a} @ {u})", f"({u} @ {a})", f"({a}.transpose() @ {u})"])
        if r == 0:
            return f"({self.vexpr(sc, d - 1)} {self.pick(['+', '-'])} {self.vexpr(sc, d - 1)})"
        if r == 1:
            return f"({self.vexpr(sc, d - 1)} * {self.expr(sc, d - 1)})"
        if r == 2:
            x = self.expr(sc, d - 1)
            return f"({self.vexpr(sc, d - 1)} / (1.0 + {x} * {x}))"
        if self.chance(0.3):
            return f"{self.vexpr(sc, d - 1)}.{self.pick(['yx', 'xx', 'yy', 'xy'])}"  # a swizzle
        return f"ti.Vector([{self.expr(sc, d - 1)}, {self.expr(sc, d - 1)}])"

    def mleaf(self, sc: _Scope, size: int) -> str:
        """A size x size matrix: a local, an element of a Matrix field, an outer product, or
        ti.Matrix([[...]]) of scalar leaves."""
        opts = [(None, x) for x, s in sc.mats if s == size]
        if size == 2:
            for name, kind in self.kinds.items():
                if kind == "M" and self.readable(name):
                    opts.append((name, f"{name}[{self.k.own if name in self.k.stored else self.index(sc)}]"))
        if opts and self.chance(0.6):
            name, text = self.pick(opts)
            if name is not None:
                self.k.reads.add(name)
            return text
        if self.chance(0.3):
            if size == 2:
                return f"{self.vexpr(sc, 1)}.outer_product({self.vexpr(sc, 1)})"
            vec3 = lambda: f"ti.Vector([{self.leaf(sc)}, {self.leaf(sc)}, {self.leaf(sc)}])"  # noqa: E731
            return f"{vec3()}.outer_product({vec3()})"
        return self.mconstruct(sc, size, lambda: self.leaf(sc))

    def mconstruct(self, sc: _Scope, size: int, entry) -> str:
        rows = ", ".join("[" + ", ".join(entry() for _ in range(size)) + "]" for _ in range(size))
        return f"ti.Matrix([{rows}])"

    def mexpr(self, sc: _Scope, size: int, d: int = 1) -> str:
        """A size x size matrix expression; a product is halved, so that nested ones stay O(1)."""
        a = self.mexpr_of(sc, size, d)
        if self.stops and d > 0 and self.frng.random() < 0.05:
            return f"ti.stop_grad({a})"  # a matrix held fixed
        return a

    def mexpr_of(self, sc: _Scope, size: int, d: int) -> str:
        if d <= 0 or self.chance(0.4):
            return self.mleaf(sc, size)
        m = lambda: self.mexpr(sc, size, d - 1)  # noqa: E731
        r = int(self.rng.integers(7))
        if r == 0:
            return f"({m()} {self.pick(['+', '-'])} {m()})"
        if r == 1:
            return f"({m()} @ {m()} * 0.5)"
        if r == 2:
            return f"{m()}.transpose()"
        if r == 3:
            return f"({m()} * {self.expr(sc, d - 1)})"
        if r == 4:
            x = self.expr(sc, d - 1)
            return f"({m()} / (1.0 + {x} * {x}))"
        if r == 5:
            return f"({m()} * {m()})"  # elementwise
        return self.mconstruct(sc, size, lambda: self.expr(sc, d - 1))

    def mscalar(self, sc: _Scope, d: int) -> str:
        """A scalar of a matrix: trace, determinant, norm, an entry, a product with vectors."""
        size = self.pick([2, 2, 3])
        a = self.mexpr(sc, size, d)
        r = int(self.rng.integers(7))
        if r == 0:
            return f"{a}.trace()"
        if r == 1:
            return f"{a}.determinant()"
        if r == 2:
            return self.pick([f"{a}.norm()", f"{a}.norm(0.01)"])
        if r == 3:
            return f"{a}.norm_sqr()"
        if r == 4:
            ints = sc.counters + sc.ints
            if ints and self.chance(0.4):  # an index computed on the GPU
                return f"{a}[{self.pick(ints)} % {size}, {int(self.rng.integers(size))}]"
            return f"{a}{self.mcomp(size)}"
        if size == 3:
            u = f"ti.Vector([{self.leaf(sc)}, {self.leaf(sc)}, {self.leaf(sc)}])"
            return self.pick([f"({a} @ {u})[{int(self.rng.integers(3))}]", f"{a}.sum()"])
        u = self.vexpr(sc, max(d - 1, 0))
        return self.pick([f"({a} @ {u})[{int(self.rng.integers(2))}]",
                          f"{u}.dot({a} @ {self.vexpr(sc, max(d - 1, 0))})"])

    def cond(self, sc: _Scope) -> str:
        hidden = self.k.hidden
        self.k.hidden = hidden - self.k.sealed
        try:
            return f"{self.expr(sc, 2)} {self.pick(['<', '>'])} {self.const(-0.5, 0.5)}"
        finally:
            self.k.hidden = hidden

    # ---- helpers (@ti.func) ------------------------------------------------------------------------
    def helper(self) -> None:
        name = self.fresh("h")
        sig = self.pick(["ss", "s", "vs"])
        saved, self.k = self.k, _Kernel(added=set(self.kinds) | {"loss"})  # helpers read no fields
        sc = _Scope(["p"])  # `p` is a float parameter here, used like a value
        self.emit(1, "@ti.func")
        if sig == "ss":
            self.emit(1, f"def {name}(p, q):")
            sc.scalars = ["p", "q"]
            sc.idx = []
            self.emit(2, f"return {self.expr_noidx(sc, 2)}")
        elif sig == "s":
            self.emit(1, f"def {name}(p):")
            sc.scalars, sc.idx = ["p"], []
            self.emit(2, "r = p")
            self.emit(2, f"for kk in range({int(self.rng.integers(1, 4))}):")
            sc.scalars.append("r")
            self.emit(3, f"r = ti.sin(r) * 0.5 + {self.expr_noidx(sc, 2)}")
            if self.chance(0.6):  # a return inside an if (wgpu_ad inlines "return anywhere")
                self.emit(2, f"if {self.expr_noidx(sc, 1)} > {self.const(-0.5, 0.5)}:")
                self.emit(3, f"return {self.expr_noidx(sc, 2)}")
            self.emit(2, f"return {self.expr_noidx(sc, 2)}")
        else:
            self.emit(1, f"def {name}(u, p):")
            sc.scalars, sc.vectors, sc.idx = ["p"], ["u"], []
            self.emit(2, f"return u * {self.expr_noidx(sc, 1)} + ti.Vector([p, {self.expr_noidx(sc, 1)}])")
        self.k = saved
        self.helpers.append((name, sig))

    def expr_noidx(self, sc: _Scope, d: int) -> str:
        # in a helper there is no loop index: leaves are parameters and constants
        sc.idx = sc.idx or []
        saved = self.leaf
        self.leaf = lambda s: self.pick(s.scalars) if self.chance(0.7) else self.const()  # type: ignore
        try:
            return self.expr(sc, d)
        finally:
            self.leaf = saved  # type: ignore

    # ---- statements --------------------------------------------------------------------------------
    def write(self, sc: _Scope, depth: int, targets: list[tuple[str, str]]) -> None:
        """One write to a target chosen for this kernel: (field, "store" | "add")."""
        name, how = self.pick(targets)
        kind = self.kinds[name] if name != "loss" else "0"
        if how == "store":
            own = f"{name}[{self.k.own}]"
            if kind in ("v", "M") and self.chance(0.35):  # one entry of the element: the rest kept
                x = own + (self.mcomp() if kind == "M" else f"[{int(self.rng.integers(2))}]")
                self.emit(depth, f"{x} = {self.pick([self.expr(sc), f'0.5 * {x} + {self.expr(sc, 2)}'])}")
                return
            if kind == "v":
                rhs = self.pick([f"{self.vexpr(sc)}", f"{own} * {self.const(0.3, 0.9)} + {self.vexpr(sc)}"])
            elif kind == "M":
                rhs = self.pick([f"{self.mexpr(sc, 2)}", f"{own} * {self.const(0.3, 0.9)} + {self.mexpr(sc, 2)}"])
            else:
                rhs = self.pick([f"{self.expr(sc)}", f"{own} * {self.const(0.3, 0.9)} + {self.expr(sc)}",
                                 f"ti.sin({own}) + {self.expr(sc, 2)}"])
            self.emit(depth, f"{own} = {rhs}")
            return
        if kind == "M":
            if self.chance(0.5):
                self.emit(depth, self.accumulate(f"{name}[{self.index(sc)}]{self.mcomp()}", self.expr(sc)))
            else:
                self.emit(depth, f"{name}[{self.index(sc)}] += {self.mexpr(sc, 2)}")
        elif kind == "0":
            self.emit(depth, self.accumulate(f"{name}[None]", self.expr(sc)))
        elif kind == "m":
            self.emit(depth, self.accumulate(f"{name}[{self.index(sc)}, {self.index(sc)}]", self.expr(sc)))
        elif kind == "c":
            self.emit(depth, self.accumulate(f"{name}[{self.index(sc)}, {self.pick(['0', '1', '2'])}, "
                                             f"{self.pick(['0', '1'])}]", self.expr(sc)))
        elif kind == "v":
            self.emit(depth, self.pick([f"{name}[{self.index(sc)}] += {self.vexpr(sc)}",
                                        f"{name}[{self.index(sc)}] -= {self.vexpr(sc)}"]))
        else:
            self.emit(depth, self.accumulate(f"{name}[{self.index(sc)}]", self.expr(sc)))

    def accumulate(self, target: str, e: str) -> str:
        """An accumulation into a scalar element: +=, -=, ti.atomic_add or ti.atomic_sub."""
        r = self.rng.random()
        if r < 0.6:
            return f"{target} += {e}"
        if r < 0.8:
            return f"{target} -= {e}"
        return f"ti.atomic_{self.pick(['add', 'sub'])}({target}, {e})"

    def stmt(self, sc: _Scope, depth: int, targets, nest: int) -> None:
        r = self.rng.random()
        if r < 0.22:
            t = self.fresh("t")
            self.emit(depth, f"{t} = {self.expr(sc)}")
            sc.scalars.append(t)
        elif r < 0.32:
            if self.matrices and self.chance(0.6):
                self.matrix_local(sc, depth)
                return
            u = self.fresh("u")
            self.emit(depth, f"{u} = {self.vexpr(sc)}")
            sc.vectors.append(u)
        elif r < 0.55 and nest < 2 and not self.k.flat:
            self.serial_loop(sc, depth, targets, nest)
        elif r < 0.55 and self.k.flat:
            self.neighbour_read(sc, depth)
        elif r < 0.72 and nest < 2:
            self.if_else(sc, depth, targets, nest)
        elif r < 0.82:
            self.neighbour_read(sc, depth)
        elif targets:
            self.write(sc, depth, targets)

    def matrix_local(self, sc: _Scope, depth: int) -> None:
        """A 2x2 or 3x3 local; a constructed one may have entries assigned after (A[r, c] = ...)."""
        size = self.pick([2, 2, 3])
        name = self.fresh("A")
        if self.chance(0.5):
            self.emit(depth, f"{name} = {self.mconstruct(sc, size, lambda: self.expr(sc, 1))}")
            for _ in range(int(self.rng.integers(1, 3))):
                self.emit(depth, f"{name}{self.mcomp(size)} {self.pick(['=', '+='])} {self.expr(sc, 2)}")
        else:
            self.emit(depth, f"{name} = {self.mexpr(sc, size)}")
        sc.mats.append((name, size))

    def body(self, sc: _Scope, depth: int, targets, nest: int, count: int) -> None:
        for _ in range(count):
            self.stmt(sc, depth, targets, nest)

    def serial_loop(self, sc: _Scope, depth: int, targets, nest: int) -> None:
        acc, kc = self.fresh("acc"), self.fresh("k")
        self.emit(depth, f"{acc} = {self.expr(sc, 2)}")
        macc = None
        if self.matrices and self.chance(0.3):  # a matrix carried through the loop too
            macc, size = self.fresh("B"), self.pick([2, 3])
            self.emit(depth, f"{macc} = {self.mexpr(sc, size, 1)}")
        trip = self.pick([str(int(self.rng.integers(1, 4))), f"cnt[{sc.idx[0]}]", f"cnt[{sc.idx[-1]}]",
                          "static", "while"])
        inner = sc.child()
        inner.scalars.append(acc)
        (inner.ints if trip == "while" else inner.counters).append(kc)
        if trip == "while":
            bound = self.pick([f"cnt[{sc.idx[0]}]", str(int(self.rng.integers(1, 4)))])
            if self.frng.random() < 0.6:  # and a condition on data, evaluated before each iteration
                bound += f" and {self.cond(inner)}"
            self.emit(depth, f"{kc} = 0")
            self.emit(depth, f"while {kc} < {bound}:")
            self.emit(depth + 1, f"{kc} += 1")
        elif trip == "static":
            self.emit(depth, f"for {kc} in ti.static(range({int(self.rng.integers(1, 4))})):")
        else:
            self.emit(depth, f"for {kc} in range({trip}):")
        self.emit(depth + 1, f"{acc} = {self.pick(['ti.sin', 'ti.tanh', ''])}({acc}) * 0.5 + {self.expr(inner, 2)}")
        if macc is not None:
            self.emit(depth + 1, f"{macc} = {self.pick([f'{macc} * 0.5', f'{macc} @ {self.mexpr(inner, size, 1)} * 0.5'])}"
                                 f" + {self.mexpr(inner, size, 1)}")
            inner.mats.append((macc, size))
        if trip != "static" and self.chance(0.5):
            self.emit(depth + 1, f"if {self.cond(inner)}:")
            self.emit(depth + 2, self.pick(["break", "continue"]))
        own = [t for t in targets if t[1] == "store"]
        if own and self.chance(0.4):  # the recursive update of an element of the thread's own
            name = own[0][0]
            x = f"{name}[{self.k.own}]"
            at = depth + 1
            if self.chance(0.4):  # only in some iterations: on the counter, or on data
                self.emit(at, f"if {kc} == {int(self.rng.integers(0, 3))}:" if trip not in ("static", "while")
                          and self.chance(0.5) else f"if {self.cond(inner)}:")
                at += 1
            if self.kinds[name] == "v":
                self.emit(at, f"{x} = {x} * 0.5 + {self.vexpr(inner, 1)}")
            elif self.kinds[name] == "M":
                self.emit(at, f"{x} = {x} * 0.5 + {self.mexpr(inner, 2, 1)}")
            else:
                upd = self.pick([f"0.5 * {x} + ", f"ti.sin({x}) * 0.5 + ", ""])  # "": a store alone
                self.emit(at, f"{x} = {upd}{self.expr(inner, 2)}")
        self.body(inner, depth + 1, targets, nest + 1, int(self.rng.integers(0, 3)))
        sc.scalars.append(acc)
        if macc is not None:
            sc.mats.append((macc, size))

    def neighbour_read(self, sc: _Scope, depth: int) -> None:
        """Stencil reads: a field the kernel does not write, at the parallel index plus one or two
        constant offsets, each under a bounds check (two-sided, one-sided, or with a condition on
        data added), and often at the index itself too, as `x[t, i + di, j + dj]` and `x[t, i, j]`
        in a simulation step (a read-only field: no race whatever the index)."""
        opts = [(name, kind) for name, kind in self.kinds.items()
                if self.readable(name) and name not in self.k.stored and kind in ("s", "v", "M", "m")]
        if not opts:
            return
        name, kind = self.pick(opts)
        self.k.reads.add(name)
        comp = self.pick(["[0]", "[1]", ".x", ".y"]) if kind == "v" else self.mcomp() if kind == "M" else ""
        dims = [sc.idx[0]] if kind != "m" else [sc.idx[0], sc.idx[-1] if len(sc.idx) > 1 else None]
        other = [self.index(sc) if ix is None else None for ix in dims]  # m's second index in a 1-D loop
        r = self.fresh("r")
        self.emit(depth, f"{r} = {self.expr(sc, 1)}")
        if self.chance(0.6):   # the element of the thread's own index as well
            own = ", ".join(o if ix is None else ix for ix, o in zip(dims, other))
            self.emit(depth, f"{r} = {r} + {self.const(0.2, 0.8)} * {name}[{own}]{comp}")
        for c0 in self.rng.choice([-2, -1, 1, 2], size=int(self.rng.integers(1, 3)), replace=False):
            subs, guards = [], []
            for ix, o in zip(dims, other):
                if ix is None:
                    subs.append(o)
                    continue
                c = int(c0) if ix == dims[0] else int(self.pick([-1, 0, 1]))
                e = ix if c == 0 else f"{ix} + {c}" if c > 0 else f"{ix} - {-c}"
                subs.append(e)
                if c:
                    guards.append(self.pick([f"0 <= {e} < {self.n}", f"{e} < {self.n}" if c > 0 else f"{e} >= 0",
                                             f"{e} >= 0 and {e} < {self.n}" if c < 0 else f"{ix} < {self.n - c}"]))
            if self.chance(0.25):
                guards.append(self.cond(sc))
            read = f"{name}[{', '.join(subs)}]{comp}"
            self.emit(depth, f"if {' and '.join(guards)}:")
            self.emit(depth + 1, f"{r} = {r} * 0.5 + {self.pick(['ti.sin', 'ti.tanh', ''])}({read}) * "
                                 f"{self.expr(sc, 1)}")
        sc.scalars.append(r)

    def if_else(self, sc: _Scope, depth: int, targets, nest: int) -> None:
        r = self.fresh("r")
        self.emit(depth, f"{r} = {self.expr(sc, 1)}")
        self.emit(depth, f"if {self.cond(sc)}:")
        a = sc.child()
        self.emit(depth + 1, f"{r} = {self.expr(a)}")
        self.body(a, depth + 1, targets, nest + 1, int(self.rng.integers(0, 2)))
        if self.chance(0.3):
            self.emit(depth, f"elif {self.cond(sc)}:")
            c = sc.child()
            self.emit(depth + 1, f"{r} = {self.expr(c)}")
            self.body(c, depth + 1, targets, nest + 1, int(self.rng.integers(0, 2)))
        if self.chance(0.7):
            self.emit(depth, "else:")
            b = sc.child()
            self.emit(depth + 1, f"{r} = {self.expr(b)}")
            self.body(b, depth + 1, targets, nest + 1, int(self.rng.integers(0, 2)))
        sc.scalars.append(r)

    # ---- kernels -----------------------------------------------------------------------------------
    def declare(self, name: str, kind: str, ndarray: bool) -> None:
        """The line of build() that creates float field (or ndarray) `name` of `kind`."""
        n = self.n
        shape = {"s": f"{n}", "v": f"{n}", "M": f"{n}", "m": f"({n}, {n})", "0": "()", "c": f"({n}, 3, 2)"}[kind]
        if ndarray:
            self.nd.add(name)
            make = {"v": "ti.Vector.ndarray(2, ti.f32, ", "M": "ti.Matrix.ndarray(2, 2, ti.f32, "}.get(kind, "ti.ndarray(ti.f32, ")
        else:
            make = {"v": "ti.Vector.field(2, dtype=ti.f32, ", "M": "ti.Matrix.field(2, 2, dtype=ti.f32, "}.get(
                kind, "ti.field(dtype=ti.f32, ")
        self.kinds[name] = kind
        self.emit(1, f"{name} = {make}shape={shape}, needs_grad=True, needs_dual=True)")

    def new_temp(self, pair: bool) -> str:
        """A fresh temporary the kernel stores into: (n,) in a 1-D loop, (n, n) in a pair loop."""
        name = self.fresh("T")
        kind = "m" if pair else self.pick(["s", "v", "M", "M"] if self.matrices else ["s", "s", "v"])
        self.declare(name, kind, self.ndarrays and self.chance(0.35))
        return name

    def choose_targets(self, pair: bool) -> list[tuple[str, str]]:
        targets = []
        stored_kinds = ("m",) if pair else ("s", "v", "M")
        if self.chance(0.6):
            targets.append((self.new_temp(pair), "store"))
        elif self.chance(0.5):
            names = [n for n, k in self.kinds.items() if k in stored_kinds and n not in self.read_before]
            if names:
                targets.append((self.pick(names), "store"))  # updated in place
        for _ in range(int(self.rng.integers(1, 3))):
            name = self.pick(list(self.kinds) + ["loss"])
            if all(name != t for t, _ in targets) and name not in self.read_before:
                targets.append((name, "add"))
        if not any(how == "add" for _, how in targets):
            targets.append(("loss", "add"))  # nothing reads the loss: always a valid target
        return targets

    def signature(self, start: int, args: list[str]) -> list[str]:
        """The ndarrays the kernel's lines from `start` on use become its first arguments (a
        kernel takes an ndarray as an argument; the parameter has the ndarray's name)."""
        text = "\n".join(self.out[start:])
        nds = [x for x in self.kinds if x in self.nd and re.search(rf"\b{x}\[", text)]
        sig = [f"{x}: ti.types.ndarray()" for x in nds]
        # sometimes a field the kernel uses is a ti.template() argument instead (drawn from an RNG
        # of its own, so the programs are otherwise those of the generator before templates)
        used = [x for x in list(self.kinds) + ["loss"] if x not in self.nd and re.search(rf"\b{x}\b", text)]
        if used and self.trng.random() < 0.2:
            tpl = used[int(self.trng.integers(len(used)))]
            nds, sig = nds + [tpl], sig + [f"{tpl}: ti.template()"]
        sig += [f"{a}: ti.f32" for a in args]
        self.out[start] = self.out[start].replace("(ARGS)", f"({', '.join(sig)})")
        return nds

    def kernel(self) -> None:
        name = self.fresh("k")
        kind = self.pick(["map", "map", "pair", "reduce"])
        self.k = _Kernel(loop=kind, flat=kind == "map" and self.chance(0.4), own="i, j" if kind == "pair" else "i")
        if self.chance(0.25):
            self.k.args = ["c0"]
        targets = self.choose_targets(kind == "pair")
        self.k.stored = {t: self.k.own for t, how in targets if how == "store"}
        self.k.added = {t for t, how in targets if how == "add"}
        self.k.reads |= set(self.k.stored)  # an update in place reads it
        ret = kind == "reduce" and self.chance(0.3)
        # shapes with fields of their own, declared before the kernel's lines
        pro = self.fresh("G") if self.chance(0.25) else None  # top-level read-then-write of a 0-d field
        rec = self.fresh("R") if kind != "pair" and not self.k.flat and self.chance(0.2) else None
        scat = self.fresh("P") if kind != "pair" and self.data_indices and self.chance(0.5) else None
        ext = self.fresh("X") if kind == "map" and self.chance(0.2) else None
        for f, fk in ((pro, "0"), (rec, "m"), (scat, "s"), (ext, "s")):
            if f is not None:
                self.declare(f, fk, False)
        self.k.hidden = {f for f in (rec, scat, ext) if f is not None}
        self.k.reads |= {f for f in (pro, rec, ext) if f is not None}  # later kernels do not write them
        # a kernel with arguments is sometimes launched twice, with others: then its loop does not
        # read what its top level overwrites (the next launch would overwrite what this one read)
        repeat = bool(self.k.args) and rec is None and ext is None and self.chance(0.4)
        written = [t for t, _ in targets if t != "loss"] + [f for f in (pro, rec, scat, ext) if f is not None]
        # @ti.ad.no_grad: run forward, no backward (docs/autodiff.md): what it overwrites gets a
        # gradient of 0, what it accumulates into (+=, -=, atomic add / sub) passes its gradient on.
        # Not with atomic max / min (X: neither an overwrite nor an accumulation). A no_grad kernel
        # reads what it overwrites only in that element's own store (`x[i] = 0.5 * x[i] + e`) and
        # in conditions (which elements it overwrites then depends on them: its backward pass
        # replays its control flow from copies taken before the launch): never into a local, so
        # that `x[i] = u + e` with `u = x[i]` (an accumulation, in the IR) cannot be written
        only_adds = all(how == "add" for _, how in targets) and not (pro or rec or scat or ext)
        no_grad = ext is None and self.frng.random() < (0.4 if only_adds else 0.1)
        if no_grad:
            self.emit(1, "@ti.ad.no_grad")
            self.k.sealed = set(self.k.stored)
            self.k.hidden |= self.k.sealed
        self.emit(1, "@ti.kernel")
        start = len(self.out)
        self.emit(1, f"def {name}(ARGS)" + (" -> ti.f32:" if ret else ":"))
        if pro is not None:
            self.prologue(pro, no_grad)
            if repeat:
                self.k.hidden.add(pro)
        fields = [f for f in self.kinds if f not in self.nd]  # a struct-for runs over a field only
        if kind == "pair":
            loops = [f"for i, j in ti.ndrange({self.n}, {self.n}):"]
            loops += [f"for i, j in {f}:" for f in fields if self.kinds[f] == "m" and self.readable(f)]
            loop_at = len(self.out)
            self.emit(2, self.pick(loops))
            sc = _Scope(["i", "j"])
        else:
            loops = [f"for i in range({self.n}):"] + [f"for i in {f}:" for f in fields
                                                        if self.kinds[f] in ("s", "v", "M")]
            if kind == "reduce":
                self.emit(2, "s = 0.0")
            loop_at = len(self.out)
            self.emit(2, self.pick(loops))
            sc = _Scope(["i"])
        if self.matrices and self.chance(0.6):
            self.matrix_local(sc, 3)
        if scat is not None and self.chance(0.5):
            self.emit(3, f"{scat}[perm[i]] = {self.expr(sc)}")  # a store through an index read from data
            scat = None
        self.body(sc, 3, targets, 0, int(self.rng.integers(1, 4)))
        if rec is not None:
            self.recurrence(sc, 3, rec)
        if ext is not None:
            self.extreme(sc, 3, ext)
        if scat is not None:
            self.emit(3, f"{scat}[perm[i]] = {self.expr(sc)}")
        if kind == "reduce":
            self.emit(3, f"s += {self.expr(sc)}")
        for t, how in targets:  # every target written at least once
            if how == "store" and no_grad and self.frng.random() < 0.5:
                self.emit(3, f"if {self.cond(sc)}:")  # not every element: the others keep their gradients
                self.write(sc, 4, [(t, how)])
            else:
                self.write(sc, 3, [(t, how)])
        if kind == "reduce":
            dest = "w" if "w" in self.k.added else "loss"
            self.k.added.add(dest)
            self.emit(2, f"{dest}[None] += s * {self.const(0.2, 0.9)}")
            if ret:
                self.emit(2, "return s")
        if self.frng.random() < 0.15:
            self.stop_field(loop_at, written)
        self.read_before |= self.k.reads
        nds = self.signature(start, self.k.args)
        for _ in range(2 if repeat else 1):
            args = nds + [self.const() for _ in self.k.args]
            self.launches.append(f"({name}, ({', '.join(args)}{',' if args else ''}))")
        if written and not ret and not repeat and self.frng.random() < 0.15:
            self.checkpoint(name, args, len(self.k.args), written)

    def stop_field(self, loop_at: int, written: list) -> None:
        """`ti.stop_grad(x)` first in the loop's body, for a field x the loop reads and the
        kernel does not write: that loop's reads of x carry no gradient (the shim reads x as it
        was at the launch)."""
        text = "\n".join(self.out[loop_at + 1:])
        opts = [f for f in self.kinds if f in self.k.reads and f not in written and f not in self.k.added
                and re.search(rf"\b{f}\[", text)]
        if opts:
            f = opts[int(self.frng.integers(len(opts)))]
            self.out.insert(loop_at + 1, "    " * 3 + f"ti.stop_grad({f})")

    def checkpoint(self, name: str, args: list, scalars: int, state: list) -> None:
        """The kernel's launch becomes the step of ti.ad.checkpoint, run 2 or 3 times, with every
        field it writes but the loss as the state; a float argument moves with the step number."""
        self.launches.pop()
        step = self.fresh("step")
        if scalars:
            args = args[:-1] + [f"{args[-1]} + 0.1 * t"]
        self.emit(1, f"def {step}(t):")
        self.emit(2, f"{name}({', '.join(args)})")
        steps = int(self.frng.integers(2, 4))
        schedule = ["revolve", "bisect", "sqrt", "store_all"][int(self.frng.integers(4))]
        self.launches.append(f"(ti.ad.checkpoint, ({step}, {steps}, [{', '.join(state)}], None, {schedule!r}))")

    def prologue(self, g: str, no_grad: bool) -> None:
        """Top-level code before the loop (one thread, run once) that reads the 0-d field g and
        then overwrites it, as in Taichi's data-access rules #1 and #2; it reads no field the
        loop writes (an earlier dispatch), and the loop may read g. In a no_grad kernel
        `g = e * g + e'` and `g *= e` must stay overwrites: e' does not read g, and e is a
        constant below 1 (`(ti.exp(ti.tanh(0 * 0.17)) + 0 * 0.38) * g + e'` folds to g + e', an
        accumulation in the IR as `g = g + c` is: fuzz seed 6027)."""
        saved = set(self.k.hidden)
        self.k.hidden |= set(self.k.stored) | ({g} if no_grad else set())
        sc = _Scope([str(int(self.rng.integers(self.n)))])  # a constant index where a loop's would be
        factor = (lambda: self.const(0.2, 0.9)) if no_grad else (lambda: self.expr(sc, 2))
        if self.chance(0.5):
            self.emit(2, f"{g}[None] = {factor()} * {g}[None] + {self.expr(sc, 2)}")
        else:
            self.emit(2, f"{g}[None] += {self.expr(sc, 2)}")
            op = self.pick(['*=', '-='])
            self.emit(2, f"{g}[None] {op} {factor() if op == '*=' else self.expr(sc, 2)}")
        self.k.hidden = saved

    def recurrence(self, sc: _Scope, depth: int, r: str) -> None:
        """r[t + 1, i] = f(r[t, i]) over the steps t of a serial loop, stored under an equality
        on an inner loop's index (`if jj == 1`): once per step, at an index computed from t."""
        t, jj = self.fresh("t"), self.fresh("jj")
        self.emit(depth, f"for {t} in range({self.n - 1}):")
        self.emit(depth + 1, f"for {jj} in range(2):")
        self.emit(depth + 2, f"if {self.pick([f'{jj} == 1', f'{jj} == {t} % 2', f'{jj} == 0'])}:")
        inner = sc.child()
        inner.counters.append(t)
        prev = f"{r}[{t}, i]"
        step = self.pick([f"0.5 * {prev}", f"0.5 * ti.sin({prev})", prev])
        self.emit(depth + 3, f"{r}[{t} + 1, i] = {step} + {self.expr(inner, 2)}")

    def extreme(self, sc: _Scope, depth: int, x: str) -> None:
        """ti.atomic_max / atomic_min into the thread's own element of x, maybe in a serial loop."""
        op = self.pick(["max", "min"])
        if self.chance(0.5):
            kk = self.fresh("k")
            self.emit(depth, f"for {kk} in range({int(self.rng.integers(1, 4))}):")
            inner = sc.child()
            inner.counters.append(kk)
            self.emit(depth + 1, f"ti.atomic_{op}({x}[i], {self.expr(inner, 2)})")
        else:
            self.emit(depth, f"ti.atomic_{op}({x}[i], {self.expr(sc, 2)})")

    def loss_kernel(self) -> None:
        """The last kernels read every float field (every element of it), so every input gets a
        gradient: `total`, and another one per LOSS_FIELDS fields past the first ones (a kernel
        binds each field with its gradient or its dual: lavapipe allows 32 buffers per shader)."""
        items = list(self.kinds.items())
        for at in range(0, len(items), LOSS_FIELDS):
            self.loss_part(items[at:at + LOSS_FIELDS], "total" if at == 0 else self.fresh("k"))

    def loss_part(self, items: list, name: str) -> None:
        self.k = _Kernel(added={"loss"})
        self.emit(1, "@ti.kernel")
        start = len(self.out)
        self.emit(1, f"def {name}(ARGS):")
        self.emit(2, f"for i in range({self.n}):")
        terms, n = [], self.n
        for name_, kind in items:
            c = self.const(0.3, 0.9)
            if kind == "s":
                terms.append(self.pick([f"{c} * {name_}[i]", f"{c} * ti.sin({name_}[i] + 0.3)",
                                        f"{c} * {name_}[i] * {name_}[i]"]))
            elif kind == "v":
                terms.append(f"{name_}[i].dot(ti.Vector([{c}, {self.const(0.3, 0.9)}]))")
            elif kind == "M":
                terms.append(f"{c} * {name_}[i].norm_sqr() + {name_}[i].trace() * {self.const(0.3, 0.9)} + "
                             f"{self.const(0.3, 0.9)} * {name_}[i]{self.mcomp()}")
            elif kind == "c":
                self.emit(3, "for j, l in ti.ndrange(3, 2):")
                self.emit(4, f"loss[None] += {c} * ti.sin({name_}[i, j, l] + 0.3) * (j + 1.0 - l)")
            elif kind == "m":
                self.emit(3, f"for j in range({n}):")
                self.emit(4, f"loss[None] += {c} * ti.sin({name_}[i, j] + 0.3) + "
                             f"{self.const(0.3, 0.9)} * {name_}[i, j] * {name_}[j, (i + 1) % {n}]")
            else:
                terms.append(f"{c} * {name_}[None] * {name_}[None] / {n}")
        if terms:
            self.emit(3, "loss[None] += " + " + ".join(terms))
        args = self.signature(start, [])
        self.launches.append(f"({name}, ({', '.join(args)}{',' if args else ''}))")

    def generate(self) -> Program:
        n = self.n
        self.emit(0, "def build(ti):")
        for name, kind in FLOAT_INPUTS.items():
            self.declare(name, kind, False)
        if self.matrices:
            self.declare("M", "M", False)
        if self.cube:
            self.declare("q", "c", False)
        if self.ndarrays:
            self.declare("na", "s", True)
            if self.chance(0.5):
                self.declare("nv", "v", True)
        self.emit(1, "loss = ti.field(dtype=ti.f32, shape=(), needs_grad=True, needs_dual=True)")
        self.emit(1, f"cnt = ti.field(dtype=ti.i32, shape={n})")
        ints = {"cnt": (n,)}
        if self.data_indices:
            self.emit(1, f"perm = ti.field(dtype=ti.i32, shape={n})")
            ints["perm"] = (n,)
        for _ in range(int(self.rng.integers(0, 3))):
            self.helper()
        for _ in range(int(self.rng.integers(1, 4))):
            self.kernel()
        self.loss_kernel()
        fields = ", ".join(f"{f!r}: {f}" for f in list(self.kinds) + ["loss"] + list(ints))
        self.emit(1, f"return {{{fields}}}, [{', '.join(self.launches)}]")
        return Program(self.seed, n, "\n".join(self.out) + "\n",
                       {f: SHAPES[k](n) for f, k in self.kinds.items()}, ints)


def generate(seed: int) -> Program:
    return Generator(seed).generate()


if __name__ == "__main__":
    for s in sys.argv[1:] or ["0"]:
        print(f"# seed {s}\n{generate(int(s)).source}")
