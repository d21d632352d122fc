"""What a kernel compiles to, as text: its IR and WGSL, and those of its adjoint and dual kernel
(mixed into lang/kernel.py Kernel, whose _get / _get_grad / _get_dual specialise and compile)."""
from __future__ import annotations

from .. import session as _session


class KernelText:
    """The inspection methods of @ti.kernel (get_ir, get_wgsl, print_ir, ...)."""

    def get_ir(self, *args) -> str:
        """The optimised IR of the kernel specialised for these arguments."""
        from ..ir.printer import format_kernel
        return format_kernel(self._get(self._device_args(args))[0].ir)

    def _device_args(self, args: tuple) -> tuple:
        """args with NumPy arrays and torch tensors for ndarray parameters replaced by device
        copies, as a launch does (the kernel is specialised for ti.ndarrays)."""
        if self._ndarrays and self._has_external(args):
            from .external import EXTERNALS
            return EXTERNALS.to_device(self, args, self._ndarrays, with_grads=False)[0]
        return args

    def get_wgsl(self, *args, grad: bool = False, checked: bool = False, dual: bool = False,
                 task: int | None = None) -> str:
        """The generated WGSL of the kernel (or of its adjoint, with checked=True of its checked
        forward variant when it has one, with dual=True of its dual kernel) for these arguments.
        Each task (a top-level loop or serial block) is a WGSL module of its own: the text holds
        them one after another, each starting with its `// wgpu_ad kernel ..., task k` line;
        task=k gives task k's module alone, which a WebGPU device compiles as it is."""
        args = self._device_args(args)
        lc = (self._get_grad(args) if grad else self._get_dual(args) if dual else self._get(args))[0]
        if checked and lc.compiled.shadowed:
            lc = _session.autodiff().checked_variant(self, lc)
        tasks = lc.ck.tasks
        if task is not None:
            if not (isinstance(task, int) and -len(tasks) <= task < len(tasks)):
                raise IndexError(f"{self.__name__}.get_wgsl(task={task!r}): the kernel has {len(tasks)} "
                                 f"task{'s' if len(tasks) != 1 else ''} (0 to {len(tasks) - 1})")
            return tasks[task].wgsl
        return "\n".join(t.wgsl for t in tasks)

    def get_grad_ir(self, *args) -> str:
        """The optimised IR of the kernel's adjoint for these arguments."""
        from ..ir.printer import format_kernel
        return format_kernel(self._get_grad(self._device_args(args))[0].ir)

    def get_dual_ir(self, *args) -> str:
        """The optimised IR of the kernel's dual kernel (forward mode) for these arguments."""
        from ..ir.printer import format_kernel
        return format_kernel(self._get_dual(self._device_args(args))[0].ir)

    def print_ir(self, *args) -> None:
        """Print get_ir(*args)."""
        print(self.get_ir(*args))

    def print_wgsl(self, *args) -> None:
        """Print get_wgsl(*args)."""
        print(self.get_wgsl(*args))
