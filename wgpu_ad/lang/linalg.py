"""ti.svd and ti.polar_decompose for 2x2 and 3x3 float32 matrices (Taichi's names and conventions).

They are library code written as @ti.func, inlined into the kernels that call them, so reverse
mode differentiates them like any user code; no custom gradient is needed because every method
here is either a closed form or a fixed number of steps of an iteration whose derivative
converges with it (measured in float64 on random matrices: the gradient of the 3x3 SVD after 4
Jacobi sweeps, and of the 3x3 polar factor after 5 Newton steps, agree with the exact ones to
1e-8 relative; one more of each is done for margin).

Conventions (Taichi's): A = U @ S @ V.transpose() with U and V rotations (det +1) and S diagonal,
S[0, 0] >= S[1, 1] >= |S[2, 2]|; the last entry is negative when det(A) < 0. A = R @ P with R
a rotation and P symmetric (P = V S V^T, indefinite when det(A) < 0).

Where singular values coincide (A a multiple of a rotation, e.g. the identity) U and V are not
unique and have no derivative; there the rotations that would separate them are frozen, which
keeps every gradient finite. The 2x2 polar factor (a closed form) and the 3x3 one for det(A) > 0
(Newton's iteration, smooth there) have exact derivatives at such points too.
"""
from __future__ import annotations

from ..errors import WgpuAdError
from ..frontend import builtins as _b
from ..frontend.methods import static
from ..types import f32
from .kernel import func
from .matrix import Matrix, Vector

_TINY = 1e-30       # below any squared float32 quantity that matters; keeps sqrt and 1/x finite
# Sweeps and steps run as serial loops, not unrolled: the IR stays a few hundred statements, and a
# kernel calling ti.svd and ti.polar_decompose on 3x3 matrices compiles with its adjoint in 5-8 s
# instead of 8-13 s (lavapipe, 2 busy cores, no shader cache); reverse mode keeps the loops'
# matrices on its per-loop stack
_JACOBI_SWEEPS = 5  # one-sided Jacobi sweeps of the 3x3 SVD (4 converge in float32, see above)
_NEWTON_STEPS = 6   # scaled Newton steps of the 3x3 polar decomposition (5 converge, see above)


@func
def _safe_sqrt(x):
    """sqrt that stays finite in value and derivative at 0 (its adjoint divides by the root)."""
    return _b.sqrt(_b.max(x, _TINY))


@func
def _polar2(A):
    # R = [[c, -s], [s, c]] with (c, s) along (a00 + a11, a10 - a01) makes R^T A symmetric
    x = A[0, 0] + A[1, 1]
    y = A[1, 0] - A[0, 1]
    r2 = x * x + y * y
    n = _safe_sqrt(r2)
    c = _b.select(r2 > _TINY, x / n, 1.0)  # A = [[a, b], [b, -a]]: any rotation; the identity
    s = _b.select(r2 > _TINY, y / n, 0.0)
    R = Matrix([[c, -s], [s, c]])
    return R, R.transpose() @ A


@func
def _svd2(A):
    R, P = _polar2(A)
    # P = V diag(m + r, m - r) V^T, V the rotation by theta = atan2(2 b, a - d) / 2
    h = 0.5 * (P[0, 0] - P[1, 1])
    b = 0.5 * (P[0, 1] + P[1, 0])
    m = 0.5 * (P[0, 0] + P[1, 1])
    r2 = h * h + b * b
    distinct = r2 > _TINY
    theta = 0.5 * _b.atan2(_b.select(distinct, b, 0.0), _b.select(distinct, h, 1.0))
    c = _b.cos(theta)
    s = _b.sin(theta)
    r = _safe_sqrt(r2)
    V = Matrix([[c, -s], [s, c]])
    S = Matrix([[m + r, 0.0], [0.0, m - r]])
    return R @ V, S, V


@func
def _rotate_columns(B, V, p, q):
    """One step of one-sided Jacobi: rotate columns p and q of B (and of V) to make them orthogonal."""
    alpha = B[0, p] * B[0, p] + B[1, p] * B[1, p] + B[2, p] * B[2, p]
    beta = B[0, q] * B[0, q] + B[1, q] * B[1, q] + B[2, q] * B[2, q]
    gamma = B[0, p] * B[0, q] + B[1, p] * B[1, q] + B[2, p] * B[2, q]
    zeta = beta - alpha
    scale = alpha + beta
    # columns already orthogonal with equal norms: no rotation (and no derivative of one)
    active = zeta * zeta + 4.0 * gamma * gamma > 1e-14 * scale * scale + _TINY
    root = _safe_sqrt(zeta * zeta + 4.0 * gamma * gamma)
    den = zeta + _b.select(zeta >= 0.0, root, -root)  # |den| >= root > 0
    t = _b.select(active, 2.0 * gamma / den, 0.0)    # tan of the smaller rotation angle
    c = 1.0 / _b.sqrt(1.0 + t * t)
    s = c * t
    for k in static(range(3)):
        bp, bq = B[k, p], B[k, q]
        B[k, p] = c * bp - s * bq
        B[k, q] = s * bp + c * bq
        vp, vq = V[k, p], V[k, q]
        V[k, p] = c * vp - s * vq
        V[k, q] = s * vp + c * vq
    return B, V


@func
def _sort_columns(B, V, n, p, q):
    """Put the longer of columns p < q of B first: (b_p, b_q) <- (b_q, -b_p), V alike (det stays +1)."""
    swap = n[q] > n[p]
    for k in static(range(3)):
        bp, bq = B[k, p], B[k, q]
        B[k, p] = _b.select(swap, bq, bp)
        B[k, q] = _b.select(swap, -bp, bq)
        vp, vq = V[k, p], V[k, q]
        V[k, p] = _b.select(swap, vq, vp)
        V[k, q] = _b.select(swap, -vp, vq)
    np_, nq = n[p], n[q]
    n[p] = _b.select(swap, nq, np_)
    n[q] = _b.select(swap, np_, nq)
    return B, V, n


@func
def _svd3(A):
    B = A  # becomes A V, column by column
    V = Matrix.identity(f32, 3)
    for _sweep in range(_JACOBI_SWEEPS):
        for p, q in static(((0, 1), (0, 2), (1, 2))):
            B, V = _rotate_columns(B, V, p, q)
    n = Vector([B[0, 0] * B[0, 0] + B[1, 0] * B[1, 0] + B[2, 0] * B[2, 0],
                B[0, 1] * B[0, 1] + B[1, 1] * B[1, 1] + B[2, 1] * B[2, 1],
                B[0, 2] * B[0, 2] + B[1, 2] * B[1, 2] + B[2, 2] * B[2, 2]])
    for p, q in static(((0, 1), (1, 2), (0, 1))):
        B, V, n = _sort_columns(B, V, n, p, q)
    b0 = Vector([B[0, 0], B[1, 0], B[2, 0]])
    b1 = Vector([B[0, 1], B[1, 1], B[2, 1]])
    b2 = Vector([B[0, 2], B[1, 2], B[2, 2]])
    # U's columns: b0 normalised, b1 made orthogonal to it and normalised, their cross product
    # (so U is a rotation even when A is singular; the last singular value takes det(A)'s sign)
    u0 = Vector([1.0, 0.0, 0.0])
    if n[0] > _TINY:
        u0 = b0 / _safe_sqrt(n[0])
    w = b1 - u0.dot(b1) * u0
    if w.dot(w) <= 1e-12 * n[0] + _TINY:  # rank <= 1: any unit vector orthogonal to u0
        axis = Vector([1.0, 0.0, 0.0])
        if _b.abs(u0[0]) > 0.5:
            axis = Vector([0.0, 1.0, 0.0])
        w = u0.cross(axis)
    u1 = w / _safe_sqrt(w.dot(w))
    u2 = u0.cross(u1)
    U = Matrix.cols([u0, u1, u2])
    S = Matrix([[u0.dot(b0), 0.0, 0.0], [0.0, u1.dot(b1), 0.0], [0.0, 0.0, u2.dot(b2)]])
    return U, S, V


@func
def _polar3(A):
    R = A
    P = A
    if A.determinant() > 0.0:
        # Newton's iteration R <- (z R + R^-T / z) / 2, z = |det R|^(-1/3): smooth in A, so its
        # derivative is exact also where singular values coincide (F = I in a simulation)
        for _step in range(_NEWTON_STEPS):
            z = _b.pow(_b.abs(R.determinant()), -1.0 / 3.0)
            R = 0.5 * (z * R + R.inverse().transpose() / z)
        P = R.transpose() @ A
        P = 0.5 * (P + P.transpose())
    else:  # a reflection: Taichi's convention from the SVD (R a rotation, P indefinite)
        U, S, V = _svd3(A)
        R = U @ V.transpose()
        P = V @ S @ V.transpose()
    return R, P


def _for_shape(what: str, small, large, n: int, m: int):
    """The implementation for an n x m matrix (called at compile time)."""
    if (n, m) == (2, 2):
        return small
    if (n, m) == (3, 3):
        return large
    raise WgpuAdError(f"{what}() takes a 2x2 or 3x3 matrix, got {n}x{m}")


@func
def svd(A, dt=None):
    """ti.svd(A): (U, S, V) with A = U @ S @ V.transpose(), for 2x2 and 3x3 float32 matrices."""
    return _for_shape("ti.svd", _svd2, _svd3, A.n, A.m)(A)


@func
def polar_decompose(A, dt=None):
    """ti.polar_decompose(A): (R, P) with A = R @ P, R a rotation, P symmetric (2x2 and 3x3)."""
    return _for_shape("ti.polar_decompose", _polar2, _polar3, A.n, A.m)(A)
