"""@ti.func calls are inlined: the callee's body is lowered in place with its own scopes."""
from __future__ import annotations

import ast
import functools
import os
import sysconfig
import types

from ..errors import CompileError, WgpuAdError
from ..types import u1
from .context import ParsedFunc, ReturnCtx
from .refs import LocalRef
from .values import Mat, dtype_of_entries, is_static


# modules whose functions are never inlined: they compute on Python numbers at compile time (or,
# for the numeric libraries, get "use ti.sin" when called on GPU values: methods.py)
NUMERIC_MODULES = frozenset({"numpy", "math", "cmath", "scipy", "torch", "jax", "cupy"})


class PlainFunc:
    """A plain Python function or lambda called in a kernel: inlined like a @ti.func (Taichi runs
    such functions on its traced values, so `f = lambda x: ti.sin(x)` works in kernels)."""

    _wgpu_ad_func = True

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = fn.__name__
        self._parsed = None

    def parsed(self) -> ParsedFunc:
        if self._parsed is None:
            self._parsed = ParsedFunc.parse(self.fn)
        return self._parsed

    def python_only(self) -> bool:
        """Whether the body uses what kernels do not support (comprehensions, try, dicts ...) or
        its source cannot be read: called on compile-time values, such a function runs in Python
        (ti.static(helper(3)), as Taichi would run it); any other is inlined, so the fields it
        reads are read when the kernel runs."""
        try:
            tree = self.parsed().tree
        except WgpuAdError:
            return True
        return any(isinstance(n, _PYTHON_ONLY) or (isinstance(n, ast.FunctionDef) and n is not tree)
                   for n in ast.walk(tree))


_PYTHON_ONLY = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Try, ast.With, ast.Lambda,
                ast.Yield, ast.YieldFrom, ast.Global, ast.Nonlocal, ast.Import, ast.ImportFrom, ast.Dict,
                ast.Set, ast.Raise, ast.ClassDef, ast.Delete, ast.Await, ast.AsyncFunctionDef)


@functools.cache
def _plain(fn) -> PlainFunc:
    """fn's PlainFunc, the same one for the process (as a PlainFunc holds its function, a weak
    mapping would keep it as long)."""
    return PlainFunc(fn)


_STDLIB = tuple(os.path.normcase(os.path.realpath(sysconfig.get_paths()[k])) + os.sep for k in ("stdlib", "platstdlib"))


def _in_stdlib(filename: str) -> bool:
    """A file of Python's standard library (a user's module named like one, test.py, is not)."""
    f = os.path.normcase(os.path.realpath(filename))
    return f.startswith(_STDLIB) and "-packages" + os.sep not in f


def module_root(obj) -> str:
    return (getattr(obj, "__module__", None) or "").split(".")[0]


def inlinable(obj):
    """The @ti.func to inline for a callee: a ti.func itself, a PlainFunc for a user's Python
    function or lambda (not one of the standard library's, a numeric library's or wgpu_ad's), or
    None. The same function always gives the same PlainFunc (its parse is kept; recursion is
    found by identity)."""
    if isinstance(obj, types.MethodType):
        return None  # bound: the caller passes __self__ and inlines __func__
    if getattr(obj, "_wgpu_ad_func", False):
        return obj
    if not isinstance(obj, types.FunctionType):
        return None
    root = module_root(obj)
    if root in NUMERIC_MODULES or root == "wgpu_ad" or _in_stdlib(obj.__code__.co_filename):
        return None
    return _plain(obj)


def _user_code(fl) -> bool:
    return module_root(fl.pf.fn) != "wgpu_ad"


def _return_kind(tree: ast.FunctionDef) -> str:
    rets = [n for n in ast.walk(tree) if isinstance(n, ast.Return)]
    if not rets:
        return "tail"
    if len(rets) == 1 and tree.body and tree.body[-1] is rets[0]:
        return "tail"
    return "flag"


def inline_func(fl, func, args: list, kwargs: dict, node: ast.Call):
    try:
        pf = func.parsed()
    except WgpuAdError as e:
        raise fl.error(node, str(e)) from None
    if func in fl.k.call_stack:
        raise fl.error(node, f"@ti.func '{pf.fn.__name__}' calls itself; recursion is not supported in kernels "
                             f"(it is inlined): use a loop")
    if len(fl.k.call_stack) > 64:
        raise fl.error(node, "ti.func calls nested too deeply")
    params = pf.tree.args
    if params.vararg or params.kwarg or params.kwonlyargs:
        raise fl.error(node, f"@ti.func '{pf.fn.__name__}': *args, **kwargs and keyword-only parameters are not supported")
    names = [a.arg for a in params.args]
    defaults = dict(zip(names[len(names) - len(params.defaults):], pf.fn.__defaults__ or ()))
    bound = dict(zip(names, args))
    if len(args) > len(names):
        raise fl.error(node, f"@ti.func '{pf.fn.__name__}' takes {len(names)} argument(s), got {len(args)}")
    for k, v in kwargs.items():
        if k not in names:
            raise fl.error(node, f"@ti.func '{pf.fn.__name__}' has no parameter '{k}'")
        bound[k] = v
    scope = {}
    sub_ret = ReturnCtx(_return_kind(pf.tree))
    sub = fl.for_callee(pf, scope, sub_ret)
    for n in names:
        if n not in bound:
            if n not in defaults:
                raise fl.error(node, f"@ti.func '{pf.fn.__name__}' is missing argument '{n}'")
            bound[n] = defaults[n]
        v = bound[n]
        if pf.assign_counts.get(n, 0) > 0 and isinstance(v, (int, float, bool)) or \
                pf.assign_counts.get(n, 0) > 0 and not is_static(v):
            # a parameter the body reassigns is a copy (pass by value, as in Taichi)
            entries = v.entries if isinstance(v, Mat) else [v]
            dt = dtype_of_entries(entries)
            slots = [fl.b.alloca(dt, n) for _ in entries]
            ref = LocalRef(slots, v.shape if isinstance(v, Mat) else (), n)
            ref.store(fl.o, v)
            scope[n] = ref
        else:
            scope[n] = v
    if sub_ret.kind == "flag":
        sub_ret.flag = fl.b.alloca(u1, f"{pf.fn.__name__}_returned")
        fl.b.store(sub_ret.flag, fl.b.const(False, u1))
        sub_ret.entry = fl.b.block
    fl.k.call_stack.append(func)
    try:
        sub.lower_body(pf.tree.body)
    except CompileError as e:
        if module_root(pf.fn) != "wgpu_ad" or not _user_code(fl):
            raise
        raise fl.error(node, e.msg, type(e)) from None  # wgpu_ad's own funcs (ti.svd): the user's call
    finally:
        fl.k.call_stack.pop()
    if sub_ret.kind == "tail":
        return sub_ret.value
    return sub_ret.slots.load(fl.o) if sub_ret.slots is not None else None
