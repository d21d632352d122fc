"""PyTorch interop: torch tensors as ndarray arguments, kernel.grad with tensors, and kernels as
autograd functions (wgpu_ad.torch). Gradients are checked against analytic derivatives or float64
central differences of the same math in NumPy."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")

import wgpu_ad as ti  # noqa: E402
import wgpu_ad.torch as wt  # noqa: E402
from ad_util import central_diff  # noqa: E402

pytestmark = pytest.mark.gpu


def test_tensors_as_ndarray_arguments_and_their_gradients():
    """y = 3 x (a store): forward values; the launch gives x and y a zero .grad (Taichi's rule);
    kernel.grad seeds from y.grad and accumulates into x.grad."""
    @ti.kernel
    def triple(x: ti.types.ndarray(), y: ti.types.ndarray()):
        for i in range(x.shape[0]):
            for j in range(x.shape[1]):
                y[i, j] = 3 * x[i, j]

    x = torch.linspace(-1, 1, 12).reshape(3, 4).requires_grad_(True)
    y = torch.zeros(3, 4, requires_grad=True)
    triple(x, y)
    np.testing.assert_allclose(y.detach().numpy(), 3 * x.detach().numpy(), rtol=1e-6)
    seed = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert torch.equal(x.grad, torch.zeros(3, 4)) and torch.equal(y.grad, torch.zeros(3, 4))
    y.grad = seed.clone()
    triple.grad(x, y)
    np.testing.assert_allclose(x.grad.numpy(), 3 * seed.numpy(), rtol=1e-6)
    triple.grad(x, y)
    np.testing.assert_allclose(x.grad.numpy(), 6 * seed.numpy(), rtol=1e-6)


def test_the_seed_program_runs(tmp_path):
    """The forum program of shared/seeds/002 (a kernel with ndarray arguments inside a
    torch.autograd.Function, Taichi failing in kernel.grad), with `import wgpu_ad as ti` and
    `.cuda()` made a `.clone()` (a copy, as .cuda() makes; there is no CUDA here). L1 loss of
    x = 1 against y = 3x: loss 2; kernel.grad writes dL/dy * 3 = 3/600 into x.grad."""
    program = textwrap.dedent('''
        import torch
        import torch.nn as nn
        import numpy as np
        import wgpu_ad as ti

        arch = ti.cuda
        ti.init(arch=arch)

        @ti.kernel
        def test_grad(
            x: ti.types.ndarray(),
            y: ti.types.ndarray(),
        ):
            for i in range(x.shape[0]):
                for j in range(x.shape[1]):
                    y[i, j] = 3 * x[i, j]

        class GradTest(nn.Module):
            def __init__(self):
                super(GradTest, self).__init__()
                self._test_grad = test_grad

                class _module_function(torch.autograd.Function):
                    @staticmethod
                    def forward(ctx, x):
                        y = torch.zeros_like(x, requires_grad=True)
                        self._test_grad(x, y)
                        ctx.save_for_backward(x, y)
                        return y

                    @staticmethod
                    def backward(ctx, dy):
                        x, y = ctx.saved_tensors
                        y.grad = dy
                        self._test_grad.grad(x, y)
                        return x.grad

                self._module_function = _module_function.apply

            def forward(self, x):
                return self._module_function(x.contiguous())

        if __name__ == "__main__":
            leaf = torch.ones((20, 30), dtype=torch.float32, requires_grad=True)
            x = leaf.clone()
            grad_test = GradTest()
            y = grad_test(x)
            L1_loss = nn.L1Loss()
            loss = L1_loss(x, y)
            print('loss:', loss.item())
            loss.backward()
            print('grad:', x.grad[0].tolist())
            print('leaf:', leaf.grad[0].tolist())
    ''')
    path = tmp_path / "seed_002.py"
    path.write_text(program)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = dict(line.split(":", 1) for line in r.stdout.splitlines() if ":" in line)
    assert float(lines["loss"]) == pytest.approx(2.0, rel=1e-6)
    np.testing.assert_allclose(eval(lines["grad"]), np.full(30, 3 / 600), rtol=1e-5)
    # the leaf: d/dx mean|x - 3x| = (-1 + 3) / 600 through both paths
    np.testing.assert_allclose(eval(lines["leaf"]), np.full(30, 2 / 600), rtol=1e-5)


# ---- wgpu_ad.torch.function ---------------------------------------------------------------------

@ti.kernel
def _square_scaled(x: ti.types.ndarray(), w: ti.f32, y: ti.types.ndarray()):
    for i in x:
        y[i] = w * x[i] * x[i]


def test_a_kernel_as_an_autograd_function():
    f = wt.function(_square_scaled, outputs={"y": "x"})
    x0 = np.linspace(-1.0, 2.0, 33)
    x = torch.tensor(x0, dtype=torch.float32, requires_grad=True)
    y = f(x, 1.5)
    np.testing.assert_allclose(y.detach().numpy(), 1.5 * x0 ** 2, rtol=1e-6)
    w = torch.tensor(np.cos(x0), dtype=torch.float32)
    (y * w).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 3.0 * x0 * np.cos(x0), rtol=1e-5, atol=1e-6)


def test_a_python_function_of_several_kernels_matches_central_differences():
    """Two kernels chained through an intermediate ndarray, vec2 inputs; the gradient of
    sum(z * v) against float64 central differences of the same math."""
    @ti.kernel
    def spring(p: ti.types.ndarray(dtype=ti.math.vec2), e: ti.types.ndarray()):
        for i in e:
            d = p[i + 1] - p[i]
            e[i] = ti.sqrt(d.dot(d) + 0.01)

    @ti.kernel
    def energy(e: ti.types.ndarray(), k: ti.f32, z: ti.types.ndarray()):
        for i in e:
            z[i] = k * (e[i] - 1.0) ** 2

    def chain(p: ti.types.ndarray(dtype=ti.math.vec2), k, e, z):
        spring(p, e)
        energy(e, k, z)

    n = 9
    f = wt.function(chain, outputs={"e": lambda p, k: (p.shape[0] - 1,), "z": lambda p, k: (p.shape[0] - 1,)})
    rng = np.random.default_rng(3)
    p0 = rng.standard_normal((n, 2))
    v = rng.standard_normal(n - 1)
    p = torch.tensor(p0, dtype=torch.float32, requires_grad=True)
    e, z = f(p, 0.7)

    def ref(q):
        d = q[1:] - q[:-1]
        return (0.7 * (np.sqrt((d * d).sum(1) + 0.01) - 1.0) ** 2 * v).sum()

    np.testing.assert_allclose(z.detach().numpy() @ v, ref(p0), rtol=1e-5)
    (z * torch.tensor(v, dtype=torch.float32)).sum().backward()
    np.testing.assert_allclose(p.grad.numpy(), central_diff(ref, p0), rtol=1e-4, atol=1e-5)


def test_ndarrays_are_reused_after_the_backward_pass():
    bridge = wt.function(_square_scaled, outputs={"y": "x"})
    x = torch.ones(16, requires_grad=True)
    bridge(x, 2.0).sum().backward()
    spare = {id(nd) for v in bridge.pool.values() for nd in v}
    assert len(spare) == 2  # x's copy and y's
    x.grad = None
    bridge(x, 2.0).sum().backward()
    assert {id(nd) for v in bridge.pool.values() for nd in v} == spare  # the same ndarrays again
    np.testing.assert_allclose(x.grad.numpy(), np.full(16, 4.0))


def test_bridge_errors_name_the_argument():
    with pytest.raises(ti.WgpuAdError, match=r"output 'out' is not an argument of _square_scaled \(x, w, y\)"):
        wt.function(_square_scaled, outputs={"out": "x"})
    f = wt.function(_square_scaled, outputs={"y": "x"})
    with pytest.raises(ti.WgpuAdError, match=r"_square_scaled: missing input\(s\) w"):
        f(torch.ones(3))


def test_fields_as_parameters_of_a_torch_optimiser():
    """A field the kernel reads is a torch Parameter: its values go in on every call, its gradient
    comes out as the Parameter's .grad, and torch.optim fits it (y = w[i % 4] * x, least squares)."""
    w = ti.field(ti.f32, shape=4, needs_grad=True)

    @ti.kernel
    def weigh(x: ti.types.ndarray(), y: ti.types.ndarray()):
        for i in x:
            y[i] = w[i % 4] * x[i]

    f = wt.function(weigh, outputs={"y": "x"}, fields={"w": w})
    p = wt.parameter(w)
    x0 = np.linspace(0.5, 2.0, 16)
    x = torch.tensor(x0, dtype=torch.float32)
    target = torch.tensor(np.array([1.0, -2.0, 0.5, 3.0])[np.arange(16) % 4] * x0, dtype=torch.float32)
    y = f(x, w=p)
    ((y - target) ** 2).sum().backward()
    want = np.zeros(4)
    for i in range(16):  # d/dw_k sum (w_{i%4} x_i - t_i)^2 at w = 0
        want[i % 4] += 2 * (0.0 - target[i].item()) * x0[i]
    np.testing.assert_allclose(p.grad.numpy(), want, rtol=1e-5)
    opt = torch.optim.Adam([p], lr=0.1)
    for _ in range(300):
        opt.zero_grad()
        ((f(x, w=p) - target) ** 2).sum().backward()
        opt.step()
    np.testing.assert_allclose(p.detach().numpy(), [1.0, -2.0, 0.5, 3.0], atol=2e-2)
    with pytest.raises(ti.WgpuAdError, match=r"weigh: field input 'w' must have shape \(4,\), got \(3,\)"):
        f(x, w=torch.zeros(3))


def test_torch_gradcheck_passes_in_float32():
    """torch.autograd.gradcheck on the bridge: float32 inputs, so a float32-sized step and
    tolerances (its default 1e-6 step is below float32's resolution)."""
    @ti.kernel
    def smooth(x: ti.types.ndarray(), y: ti.types.ndarray()):
        for i in y:
            y[i] = ti.sin(x[i]) * x[i + 1] + ti.exp(-x[i] * x[i])

    f = wt.function(smooth, outputs={"y": lambda x: (x.shape[0] - 1,)})
    x = torch.tensor(np.linspace(-1.0, 1.0, 7), dtype=torch.float32, requires_grad=True)
    with pytest.warns(UserWarning, match="double precision"):
        assert torch.autograd.gradcheck(f, (x,), eps=1e-2, atol=2e-3, rtol=1e-2)


def test_tensors_inside_a_tape():
    """A kernel launched with a tensor inside ti.ad.Tape: the backward pass copies the tensor in
    again and accumulates its gradient into x.grad (loss = sum x^3 -> 3 x^2)."""
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def cubes(x: ti.types.ndarray()):
        for i in x:
            loss[None] += x[i] ** 3

    x0 = np.linspace(-1.0, 1.0, 20)
    x = torch.tensor(x0, dtype=torch.float32, requires_grad=True)
    with ti.ad.Tape(loss=loss):
        cubes(x)
    assert loss[None] == pytest.approx((x0 ** 3).sum(), abs=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), 3 * x0 ** 2, rtol=1e-5, atol=1e-6)


def test_a_field_input_used_by_two_calls_of_one_graph():
    """A rollout: z1 = f(x, w=p), z2 = f(z1, w=q), L = sum(v z2) with y[i] = w[i % 4] x[i]; one
    backward(). Each call's backward pass starts from a zero field gradient and the field values
    its forward pass saw: dL/dp_k = sum_{i%4=k} v q x, dL/dq_k = sum v p x, dL/dx = v q p (the
    second call's values in the field must not leak into the first call's adjoint)."""
    w = ti.field(ti.f32, shape=4, needs_grad=True)

    @ti.kernel
    def weigh(x: ti.types.ndarray(), y: ti.types.ndarray()):
        for i in x:
            y[i] = w[i % 4] * x[i]

    f = wt.function(weigh, outputs={"y": "x"}, fields={"w": w})
    rng = np.random.default_rng(7)
    x0, v0 = rng.uniform(0.5, 2.0, 12), rng.standard_normal(12)
    p0, q0 = np.array([1.0, -2.0, 0.5, 3.0]), np.array([0.25, 1.5, -1.0, 2.0])
    x = torch.tensor(x0, dtype=torch.float32, requires_grad=True)
    p = torch.tensor(p0, dtype=torch.float32, requires_grad=True)
    q = torch.tensor(q0, dtype=torch.float32, requires_grad=True)
    z2 = f(f(x, w=p), w=q)
    (z2 * torch.tensor(v0, dtype=torch.float32)).sum().backward()
    k = np.arange(12) % 4
    want_p = np.bincount(k, v0 * q0[k] * x0, minlength=4)
    want_q = np.bincount(k, v0 * p0[k] * x0, minlength=4)
    np.testing.assert_allclose(p.grad.numpy(), want_p, rtol=1e-5)
    np.testing.assert_allclose(q.grad.numpy(), want_q, rtol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), v0 * q0[k] * p0[k], rtol=1e-5)
    # the same parameter twice: its gradient is the sum of both calls' (2 sum v p x), not 3x
    p.grad = None
    z2 = f(f(x, w=p), w=p)
    (z2 * torch.tensor(v0, dtype=torch.float32)).sum().backward()
    np.testing.assert_allclose(p.grad.numpy(), 2 * np.bincount(k, v0 * p0[k] * x0, minlength=4), rtol=1e-5)


def _forum_function(fixed: bool):
    """Seed 002's autograd Function (y = 3 x through kernel.grad); fixed: docs/pytorch.md's fix,
    kernel.grad on a detached copy of x whose .grad is returned."""
    @ti.kernel
    def test_grad(x: ti.types.ndarray(), y: ti.types.ndarray()):
        for i in range(x.shape[0]):
            for j in range(x.shape[1]):
                y[i, j] = 3 * x[i, j]

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = torch.zeros_like(x, requires_grad=True)
            test_grad(x, y)
            ctx.save_for_backward(x, y)
            return y

        @staticmethod
        def backward(ctx, dy):
            x, y = ctx.saved_tensors
            y.grad = dy
            if fixed:
                xd = x.detach().requires_grad_()
                test_grad.grad(xd, y)
                return xd.grad
            test_grad.grad(x, y)  # the line the warning points at
            return x.grad
    return Fn.apply


def test_kernel_grad_into_a_leaf_during_torch_backward_warns_of_the_double_count():
    """Seed 002 with x a leaf (no .cuda()): kernel.grad() adds 3/600 into x.grad, backward returns
    x.grad and torch adds it again: 5/600 where d/dx mean|x - 3x| = 2/600. Warned, at the user's
    line; the documented fix gives 2/600."""
    x = torch.ones((20, 30), dtype=torch.float32, requires_grad=True)
    f = _forum_function(fixed=False)
    with pytest.warns(ti.TorchGradWarning) as record:
        torch.nn.L1Loss()(x, f(x)).backward()
    message = str(record[0].message)
    assert message.startswith("test_grad.grad() added the gradient of argument 'x' into x.grad while torch's "
                              "backward pass is running, and x is a leaf tensor of that pass")
    assert "if the torch.autograd.Function's backward returns x.grad, the gradient is counted twice" in message
    assert record[0].filename == __file__
    np.testing.assert_allclose(x.grad.numpy(), np.full((20, 30), 5 / 600), rtol=1e-5)  # what it warns of

    x = torch.ones((20, 30), dtype=torch.float32, requires_grad=True)
    f = _forum_function(fixed=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ti.TorchGradWarning)
        warnings.filterwarnings("ignore", "The .grad attribute of a Tensor that is not a leaf")  # torch's, xc.clone()
        torch.nn.L1Loss()(x, f(x)).backward()
        np.testing.assert_allclose(x.grad.numpy(), np.full((20, 30), 2 / 600), rtol=1e-5)
        xc = torch.ones((20, 30), dtype=torch.float32, requires_grad=True)
        torch.nn.L1Loss()(xc, _forum_function(fixed=False)(xc.clone())).backward()  # not a leaf: no warning
        np.testing.assert_allclose(xc.grad.numpy(), np.full((20, 30), 2 / 600), rtol=1e-5)


# ---- Taichi's torch rules (issue 26 item 10): .grad made at launch, a torch tensor as the tape's loss --
def _kernel_sum_of_a_plus():
    @ti.kernel
    def accumulate(x: ti.types.ndarray(), y: ti.types.ndarray()):
        for i in x:
            a = 2.0
            for j in range(3):
                a += x[i] / x.shape[0]
            y[0] += a
    return accumulate


def test_a_launch_gives_tensors_with_requires_grad_a_zero_grad():
    """Taichi's rule: a launch allocates .grad = zeros for each requires_grad tensor that has none, so
    the output's .grad can be seeded in place; y = sum_i (2 + 3 x_i / n), dy/dx_i = 3 / n = 1."""
    acc = _kernel_sum_of_a_plus()
    x = torch.tensor([0.3, -0.2, 0.9], requires_grad=True)
    y = torch.zeros(1, requires_grad=True)
    plain = torch.zeros(3)  # no requires_grad: no .grad
    acc(x, y)
    acc(plain, torch.zeros(1))
    assert plain.grad is None
    assert torch.equal(x.grad, torch.zeros(3)) and torch.equal(y.grad, torch.zeros(1))
    assert y.item() == pytest.approx(6.0 + (0.3 - 0.2 + 0.9), rel=1e-6)
    y.grad.fill_(1.0)
    acc.grad(x, y)
    np.testing.assert_allclose(x.grad.numpy(), [1.0, 1.0, 1.0], rtol=1e-6)


def test_needs_grad_false_annotation_leaves_the_tensor_gradient_zero():
    """ti.types.ndarray(needs_grad=False): the tensor keeps the zero .grad its launch made."""
    @ti.kernel
    def acc(x: ti.types.ndarray(needs_grad=False), y: ti.types.ndarray()):
        for i in range(3):
            y[0] += x[i] * 2.0

    x = torch.rand(3, requires_grad=True)
    y = torch.rand(1, requires_grad=True)
    acc(x, y)
    y.grad.fill_(1.0)
    acc.grad(x, y)
    assert torch.equal(x.grad, torch.zeros(3))


@pytest.mark.parametrize("n", [3, 5])
def test_a_torch_tensor_as_the_tapes_loss(n):
    """ti.ad.Tape(loss=<one-element tensor>): zeroed on entry, seeded with loss.grad = 1 on exit
    (made when absent); x.grad gets d/dx_i sum_i (2 + 3 x_i / n) = 3 / n."""
    acc = _kernel_sum_of_a_plus()
    x0 = np.linspace(-1.0, 1.0, n)
    x = torch.tensor(x0, dtype=torch.float32, requires_grad=True)
    loss = torch.full((1,), 7.0, requires_grad=True)  # zeroed by the tape
    with ti.ad.Tape(loss=loss):
        acc(x, loss)
    assert loss.item() == pytest.approx(2.0 * n + 3.0 * x0.sum() / n, abs=1e-5)
    assert torch.equal(loss.grad, torch.ones(1))
    np.testing.assert_allclose(x.grad.numpy(), np.full(n, 3.0 / n), rtol=1e-6)


def test_a_torch_loss_that_is_not_a_leaf():
    """As in Taichi, the loss may be any one-element tensor that requires a gradient: its .grad is
    made for the seed (no torch warning about a non-leaf's .grad); d/dx sum_i (2 + 3 x_i / n) = 3 / n."""
    acc = _kernel_sum_of_a_plus()
    x = torch.tensor([0.5, 1.5], requires_grad=True)
    loss = torch.zeros(1, requires_grad=True) * 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with ti.ad.Tape(loss=loss):
            acc(x, loss)
    assert loss.item() == pytest.approx(4.0 + 3.0 * 2.0 / 2, rel=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), [1.5, 1.5], rtol=1e-6)


def test_a_torch_loss_that_cannot_be_seeded_is_refused_by_name():
    acc = _kernel_sum_of_a_plus()
    x = torch.ones(4, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"^ti.ad.Tape\(loss=...\): the torch loss \(a torch.float32 tensor of "
                                           r"shape \(2,\)\) must hold one number"):
        with ti.ad.Tape(loss=torch.ones(2, requires_grad=True)):
            acc(x, torch.ones(2, requires_grad=True))
    with pytest.raises(RuntimeError, match=r"has requires_grad=False, so it has no gradient to seed: create it "
                                           r"with requires_grad=True$"):
        with ti.ad.Tape(loss=torch.ones(1)):
            pass
    with pytest.raises(RuntimeError, match=r"must be float32, the dtype wgpu_ad kernels compute in"):
        with ti.ad.Tape(loss=torch.ones(1, dtype=torch.float64, requires_grad=True)):
            pass
    with pytest.raises(ti.WgpuAdError, match=r"or a one-element torch tensor with requires_grad=True\), got list"):
        ti.ad.Tape(loss=[1.0])


def test_a_kernel_in_a_hand_written_autograd_function_with_a_non_leaf_input():
    """Taichi's test_ad_mixed_with_torch: b = 2 a (not a leaf) goes through a Function whose
    backward seeds the output's .grad and returns b.grad from kernel.grad; p = sum 2 b, so
    d p / d a = 4."""
    @ti.kernel
    def twice_sum(b: ti.types.ndarray(), p: ti.types.ndarray()):
        for i in b:
            p[0] += b[i] * 2

    class TwiceSum(torch.autograd.Function):
        @staticmethod
        def forward(ctx, b):
            p = torch.zeros(1, requires_grad=True)
            twice_sum(b, p)
            ctx.save_for_backward(b, p)
            return p

        @staticmethod
        def backward(ctx, dp):
            b, p = ctx.saved_tensors
            p.grad = dp.clone()
            twice_sum.grad(b, p)  # b is not a leaf: torch accumulates nothing into b.grad itself
            return b.grad

    a = torch.ones(4, requires_grad=True)
    TwiceSum.apply(a * 2).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), np.full(4, 4.0), rtol=1e-6)


def test_float64_tensors_under_the_f64_opt_in():
    """ti.init(f64="f32"): float64 tensors, the tape's loss included, are computed in float32 and
    their values and gradients written back as float64: loss = sum x^3 -> 3 x^2."""
    with pytest.warns(ti.Float64Warning):
        ti.init(f64="f32")

    @ti.kernel
    def cubes(x: ti.types.ndarray(), loss: ti.types.ndarray()):
        for i in x:
            loss[0] += x[i] ** 3

    x0 = np.array([0.5, -1.0, 2.0])
    x = torch.tensor(x0, dtype=torch.float64, requires_grad=True)
    loss = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    with ti.ad.Tape(loss=loss):
        cubes(x, loss)
    assert loss.dtype == torch.float64 and x.grad.dtype == torch.float64
    assert loss.item() == pytest.approx((x0 ** 3).sum(), rel=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), 3 * x0 ** 2, rtol=1e-6)


@pytest.mark.parametrize("inside", ["function", "grad_replaced"])
def test_a_rollout_of_two_calls_through_an_intermediate_field_has_each_calls_gradient(inside):
    """fn = a(x); b(y) with a field h between them, called twice in one graph: the second call
    overwrites h before the first call's backward pass, whose adjoint of b reads h. Each call's
    adjoint gets the h its forward pass left (it got the second call's: a silently wrong gradient),
    and h holds the last call's values again afterwards. d/dx sum((x^2)^2) = 4 x^3. With the
    kernels inside a ti.ad.grad_replaced function (whose gradient calls their .grad), whose
    launches were not looked at: 16 where 4 is right."""
    h = ti.field(ti.f32, shape=4, needs_grad=True)

    @ti.kernel
    def square_into_h(x: ti.types.ndarray()):
        for i in h:
            h[i] = x[i] * x[i]

    @ti.kernel
    def square_h(y: ti.types.ndarray()):
        for i in h:
            y[i] = h[i] * h[i]

    def fourth_power(x, y):
        square_into_h(x)
        square_h(y)

    if inside == "grad_replaced":
        fourth_power = ti.ad.grad_replaced(fourth_power)

        @ti.ad.grad_for(fourth_power)
        def fourth_power_grad(x, y):
            square_h.grad(y)
            square_into_h.grad(x)

    f = wt.function(fourth_power, outputs={"y": "x"})
    x1 = torch.tensor([1.0, 2.0, 3.0, 0.5], requires_grad=True)
    x2 = torch.tensor([2.0, -1.0, 1.5, 1.0], requires_grad=True)
    loss = f(x1).sum() + 2.0 * f(x2).sum()
    loss.backward()
    np.testing.assert_allclose(x1.grad.numpy(), 4 * x1.detach().numpy() ** 3, rtol=1e-6)
    np.testing.assert_allclose(x2.grad.numpy(), 8 * x2.detach().numpy() ** 3, rtol=1e-6)
    np.testing.assert_allclose(h.to_numpy(), x2.detach().numpy() ** 2, rtol=1e-6)


def test_field_to_torch_and_from_torch_in_an_autograd_function():
    """Taichi's test_torch_ad pattern: x.from_torch / y.to_torch in a torch.autograd.Function around
    y[n-1-i] = x[i]**2 and its kernel.grad; the gradient of sum(y) is 2 x (analytic), reversed
    fields and all, on every one of several calls. to_torch copies (a later write does not show)."""
    n = 8
    x = ti.field(ti.f32, shape=n, needs_grad=True)
    y = ti.field(ti.f32, shape=n, needs_grad=True)

    @ti.kernel
    def square_reversed():
        for i in range(n):
            y[n - i - 1] = x[i] * x[i]

    class Sqr(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp):
            x.from_torch(inp)
            square_reversed()
            return y.to_torch()

        @staticmethod
        def backward(ctx, g):
            ti.ad.clear_all_gradients()
            y.grad.from_torch(g)
            square_reversed.grad()
            return x.grad.to_torch()

    rng = np.random.default_rng(3)
    for _ in range(3):
        v = rng.uniform(-2, 2, n).astype(np.float32)
        w = rng.uniform(-1, 1, n).astype(np.float32)
        X = torch.tensor(v, requires_grad=True)
        out = Sqr.apply(X)
        np.testing.assert_allclose(out.detach().numpy(), (v.astype(np.float64) ** 2)[::-1], rtol=1e-6)
        (out * torch.from_numpy(w)).sum().backward()
        np.testing.assert_allclose(X.grad.numpy(), 2 * v.astype(np.float64) * w[::-1], rtol=1e-6)
    t = x.to_torch()
    assert t.dtype == torch.float32 and t.shape == (n,)
    x.fill(0.0)
    assert torch.equal(t, torch.from_numpy(v))
    m = ti.Vector.field(2, ti.f32, shape=3)
    with pytest.raises(ti.WgpuAdError, match=r"from_torch: expected an array of shape \(3, 2\) \(shape \(3,\) \+ "
                                             r"element shape \(2,\)\), got shape \(3,\)"):
        m.from_torch(torch.zeros(3))
