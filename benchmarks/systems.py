"""The systems compared, each in its own worker process, driven over a pipe.

A worker holds one system (wgpu_ad, hand-written WGSL on raw wgpu-py, Taichi Vulkan, CUDA and CPU,
NVIDIA Warp on the CPU, PyTorch eager and torch.compile'd, JAX jit; and, on request, wgpu_ad-cas:
wgpu_ad with float atomics emulated by compare-exchange loops even where the adapter has native
atomic<f32>, to measure the two paths side by side)
for the whole run, so the driver can interleave systems within each repetition without
re-initialising anything (Taichi allows one arch per process). The worker times each run itself,
with the sync inside the timed region, so the pipe costs nothing that is measured. Its stdout and
stderr (Taichi's banners, lavapipe's warnings) go to a log file, whose tail is shown on failure.
"""
from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os
import sys
import time
import traceback

from .workloads import NotWritten

ALL_SYSTEMS = ("wgpu_ad", "wgsl", "taichi-vulkan", "taichi-cuda", "taichi-cpu", "warp-cpu", "torch", "torch-compile",
               "jax", "wgpu_ad-cas")
OPT_IN = ("wgpu_ad-cas",)  # run only when named in --systems
# the Python package each optional system needs, and how to get it
NEEDS = {"taichi-vulkan": ("taichi", "pip install taichi==1.7.4"), "taichi-cuda": ("taichi", "pip install taichi==1.7.4"),
         "taichi-cpu": ("taichi", "pip install taichi==1.7.4"), "warp-cpu": ("warp", "pip install warp-lang"),
         "torch": ("torch", "pip install torch"), "torch-compile": ("torch", "pip install torch"),
         "jax": ("jax", "pip install jax jaxlib")}
REPLY_TIMEOUT_S = 600.0
# A worker waits while the others run. On the 2-vCPU VM these numbers come from, a process that
# slept for ~0.5 s then runs many short dispatches up to 4x slower (lavapipe: 14 -> 55 us per
# launch) until it has been busy for a while; 0.1 s of busy-waiting before each timed run removes
# that, as in a program that runs continuously. Every system gets the same.
WARM_SPIN_S = 0.1


def installed(system: str) -> bool:
    """Whether the package `system` needs imports here (without importing it)."""
    need = NEEDS.get(system)
    return need is None or importlib.util.find_spec(need[0]) is not None


def taichi_available() -> bool:
    return installed("taichi-cpu")


def warp_available() -> bool:
    return installed("warp-cpu")


def default_systems() -> list[str]:
    return [s for s in ALL_SYSTEMS if s not in OPT_IN and installed(s)]


# ---- inside the worker process ------------------------------------------------------------------

class _Env:
    """How one system starts, restarts between cases, and builds a workload."""

    def __init__(self, system: str):
        self.system = system
        self.gpu = self.tt = None
        self.unavailable = None   # why this system cannot run here (every case skips, saying so)
        if system in ("wgpu_ad", "wgpu_ad-cas"):
            import wgpu_ad
            self.ti = wgpu_ad
        elif system.startswith("taichi"):
            import taichi
            self.ti = taichi
        elif system == "wgsl":
            from .rawgpu import RawGpu
            self.gpu = RawGpu()
        elif system == "warp-cpu":
            import warp
            warp.config.quiet = True
            warp.init()
            self.ti = warp
        elif system in ("torch", "torch-compile"):
            import torch
            from .workloads import TorchEnv
            self.ti = torch
            self.tt = TorchEnv(torch, "cuda" if torch.cuda.is_available() else "cpu", system == "torch-compile")
            if self.tt.device == "cpu":
                # one thread, like warp-cpu: on the 2-core VM shared with other work, torch.compile's
                # OpenMP kernels with 2 threads took 6 s for gravity N=256's fwd+bwd (a parallel
                # region waits for its descheduled thread each time), 0.8 ms with one
                torch.set_num_threads(1)
        elif system == "jax":
            os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # GPU memory for the other systems
            import jax
            self.ti = jax
        else:
            raise ValueError(f"unknown system {system!r}; expected one of {ALL_SYSTEMS}")

    def start_case(self) -> str:
        """A clean runtime for the next case; returns a description of the device."""
        if self.unavailable:
            raise NotWritten(self.unavailable)
        ti = self.ti if self.gpu is None else None
        if self.system in ("wgpu_ad", "wgpu_ad-cas"):
            ti.init(force_emulated_atomics=self.system == "wgpu_ad-cas")
            return str(ti.get_runtime())
        if self.system == "wgsl":
            info = self.gpu.adapter.info
            return f"raw wgpu-py on {info.get('device', '?')} ({info.get('backend_type', '?')})"
        if self.system == "warp-cpu":
            ti.set_device("cpu")
            return f"warp {ti.__version__} on the CPU (one thread)"
        if self.tt is not None:
            ti._dynamo.reset()  # compiled graphs of the last case go
            where = (ti.cuda.get_device_name() if self.tt.device == "cuda"
                     else f"the CPU ({ti.get_num_threads()} thread{'s' if ti.get_num_threads() > 1 else ''})")
            return f"torch {ti.__version__} {'torch.compile' if self.tt.compiled else 'eager'} on {where}"
        if self.system == "jax":
            d = ti.devices()[0]
            return f"jax {ti.__version__} jit on {d.platform} ({d.device_kind})"
        arch = {"taichi-vulkan": ti.vulkan, "taichi-cuda": ti.cuda, "taichi-cpu": ti.cpu}[self.system]
        ti.init(arch=arch)
        got = ti.lang.impl.current_cfg().arch
        if got != arch:  # Taichi falls back to the CPU silently when Vulkan or CUDA does not start
            if self.system == "taichi-cuda":
                self.unavailable = f"Taichi could not start arch=cuda here (it fell back to {got}): no CUDA GPU"
                raise NotWritten(self.unavailable)
            raise RuntimeError(f"Taichi could not start arch={arch} (it fell back to {got}); see its log")
        version = ".".join(map(str, ti.__version__)) if isinstance(ti.__version__, tuple) else ti.__version__
        return f"taichi {version} arch={got}"

    def build(self, workload: str, params: dict):
        from .workloads import Case
        mod = Case(workload, params).module()
        inp = mod.inputs(params)
        if self.system == "wgsl":
            return mod.build_wgsl(self.gpu, params, inp)
        special = {"warp-cpu": ("build_warp", "Warp", self.ti), "torch": ("build_torch", "PyTorch", self.tt),
                   "torch-compile": ("build_torch", "PyTorch", self.tt), "jax": ("build_jax", "JAX", self.ti)}
        if self.system in special:
            fn, lib, arg = special[self.system]
            if not hasattr(mod, fn):
                raise NotWritten(f"no {lib} version of the {workload} workload")
            return getattr(mod, fn)(arg, params, inp)
        return mod.build(self.ti, params, inp)

    def warm_up(self, prog) -> None:
        """Run every mode once: compile and warm up, so nothing timed is a first run."""
        try:
            for op in prog.ops.values():
                op()
        except Exception as e:
            if self.system != "torch-compile":
                raise
            msg = (str(e).strip().splitlines() or ["?"])[0][:300]
            raise NotWritten(f"torch.compile failed here ({type(e).__name__}: {msg})") from e

    def copy_bandwidth(self, nbytes: int, reps: int) -> dict:
        """Device memory copy of nbytes (wgsl: wgpu copy_buffer_to_buffer on the adapter wgpu_ad
        uses; torch: Tensor.copy_ on torch's device), see bandwidth.py."""
        from . import bandwidth
        if self.gpu is not None:
            return bandwidth.wgpu_copy(self.gpu, nbytes, reps)
        if self.tt is not None:
            return bandwidth.torch_copy(self.tt, nbytes, reps)
        raise NotWritten(f"{self.system} does not measure the copy bandwidth")


def worker_main(system: str, conn, log_path: str) -> None:
    """Serve ('setup', workload, params) / ('time', mode) / ('result',) / ('quit',) requests."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    env, prog = None, None
    while True:
        msg = conn.recv()
        try:
            if msg[0] == "quit":
                conn.send(("ok", None))
                return
            if msg[0] == "setup":
                prog = None
                if env is None:
                    env = _Env(system)
                device = env.start_case()
                prog = env.build(msg[1], msg[2])
                env.warm_up(prog)
                reply = device
            elif msg[0] == "time":
                op = prog.ops[msg[1]]
                t0 = time.perf_counter()
                while time.perf_counter() - t0 < WARM_SPIN_S:
                    pass
                t0 = time.perf_counter()
                op()
                reply = time.perf_counter() - t0
            elif msg[0] == "result":
                reply = prog.result()
            elif msg[0] == "copy":
                if env is None:
                    env = _Env(system)
                reply = env.copy_bandwidth(msg[1], msg[2])
            else:
                raise ValueError(f"unknown request {msg!r}")
            conn.send(("ok", reply))
        except NotWritten as e:
            prog = None
            conn.send(("skip", str(e)))
        except Exception as e:  # noqa: BLE001  (report it, keep serving: the next case may work)
            prog = None if msg[0] == "setup" else prog
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}"))


# ---- in the driver ------------------------------------------------------------------------------

class WorkerError(RuntimeError):
    pass


class WorkerSkip(WorkerError):
    """The system has no version of this workload."""


class Worker:
    """A worker process for one system."""

    def __init__(self, system: str, log_dir: str):
        self.system = system
        self.log_path = os.path.join(log_dir, f"{system}.log")
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(system, child, self.log_path), daemon=True)
        self.proc.start()
        child.close()

    def call(self, *msg):
        """Send a request and return the reply; WorkerError carries the worker's traceback."""
        try:
            self.conn.send(msg)
            if not self.conn.poll(REPLY_TIMEOUT_S):
                raise WorkerError(f"{self.system}: no reply to {msg[0]!r} in {REPLY_TIMEOUT_S:.0f} s")
            status, value = self.conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError) as e:
            raise WorkerError(f"{self.system}: the worker process died ({type(e).__name__}, exit code "
                              f"{self.proc.exitcode}); its log ends with:\n{self.log_tail()}") from None
        if status == "skip":
            raise WorkerSkip(f"{self.system}: {value}")
        if status != "ok":
            raise WorkerError(f"{self.system}: {value}")
        return value

    def log_tail(self, lines: int = 15) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                keep = [ln for ln in f.read().splitlines() if "XDG_RUNTIME_DIR" not in ln]
            return "\n".join(keep[-lines:])
        except OSError:
            return "(no log)"

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.call("quit")
            except WorkerError:
                pass
            self.proc.join(10)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)
