"""Robust losses with Ceres' definitions and Ceres' residual/Jacobian correction.

A loss maps the squared norm ``s = |f|^2`` of a residual block to ``rho(s)``; the cost is
``1/2 sum rho(s)``. ``evaluate(s)`` returns ``rho, rho', rho''`` (vectorised). With a scale ``a``
(``b = a^2``), as in ``ceres/loss_function.h``:

- trivial:   ``rho = s``
- huber:     ``rho = s`` for ``s <= b``, else ``2 a sqrt(s) - b``
- soft_l1:   ``rho = 2 b (sqrt(1 + s / b) - 1)``
- cauchy:    ``rho = b log(1 + s / b)``

:func:`correct` applies Ceres' ``Corrector`` (Triggs et al., "Bundle adjustment: a modern
synthesis", section 4.3) so that the Gauss-Newton model of the robustified problem is an ordinary
least-squares problem in corrected residuals and Jacobians: the gradient ``J~^T f~`` equals
``rho' J^T f`` exactly, and the curvature term ``2 rho'' J^T f f^T J`` is kept where ``rho'' > 0``.
"""
from __future__ import annotations

import numpy as np

# Ceres clamps rho' from below by the smallest normal double so a far outlier keeps a tiny weight.
_TINY = np.finfo(np.float64).tiny

LOSSES = ("trivial", "huber", "soft_l1", "cauchy")
"""The robust losses by name (``loss=`` of :func:`solvers.solve` and the residual blocks), Ceres' ``TrivialLoss``, ``HuberLoss``, ``SoftLOneLoss`` and ``CauchyLoss``."""


class Loss:
    """A robust loss ``rho`` of the squared residual norm ``s``, as Ceres' loss functions.

    The cost of a residual block is ``rho(s) / 2``; ``scale`` is where the loss leaves the
    quadratic (Ceres' ``a``, in the residual's units: pixels for reprojections).

    Args:
        name: one of :data:`solvers.LOSSES` (``"trivial"``, ``"huber"``, ``"soft_l1"``,
            ``"cauchy"``); None, ``"none"`` or ``""`` mean ``"trivial"``.
        scale: a positive finite number.

    Raises:
        ValueError: an unknown name or a scale that is not positive and finite.
    """

    def __init__(self, name: str = "trivial", scale: float = 1.0):
        name = "trivial" if name in (None, "none", "") else str(name).lower().replace("-", "_")
        if name not in LOSSES:
            raise ValueError(f"loss={name!r} is not one of {LOSSES}")
        scale = float(scale)
        if not (scale > 0 and np.isfinite(scale)):
            raise ValueError(f"loss scale must be a positive finite number, got {scale}")
        self.name, self.scale = name, scale
        self.b = scale * scale

    def __repr__(self):
        return "Loss('trivial')" if self.name == "trivial" else f"Loss({self.name!r}, scale={self.scale:g})"

    def evaluate(self, s):
        """``rho(s), rho'(s), rho''(s)`` for squared norms ``s`` (any shape)."""
        s = np.asarray(s, dtype=np.float64)
        a, b = self.scale, self.b
        if self.name == "trivial":
            return s, np.ones_like(s), np.zeros_like(s)
        if self.name == "huber":
            outlier = s > b
            r = np.sqrt(np.where(outlier, s, 1.0))
            rho0 = np.where(outlier, 2.0 * a * r - b, s)
            rho1 = np.where(outlier, np.maximum(_TINY, a / r), 1.0)
            rho2 = np.where(outlier, -rho1 / (2.0 * np.where(outlier, s, 1.0)), 0.0)
            return rho0, rho1, rho2
        c = 1.0 / b
        total = 1.0 + s * c
        if self.name == "soft_l1":
            tmp = np.sqrt(total)
            rho1 = np.maximum(_TINY, 1.0 / tmp)
            return 2.0 * b * (tmp - 1.0), rho1, -(c * rho1) / (2.0 * total)
        inv = 1.0 / total  # cauchy
        return b * np.log(total), np.maximum(_TINY, inv), -c * (inv * inv)

    def cost(self, sq_norms) -> float:
        """``1/2 sum rho(s)``."""
        if self.name == "trivial":
            return 0.5 * float(np.sum(sq_norms))
        return 0.5 * float(np.sum(self.evaluate(sq_norms)[0]))


def correct(loss: Loss, r, jacobians):
    """Corrected residuals and Jacobians, as Ceres' ``Corrector``, for residual blocks ``r`` (n, m)
    and Jacobian blocks ``jacobians`` (a list of (n, m, k) arrays); returns ``(cost, r~, [J~...])``.

    Where ``rho'' <= 0`` or ``s = 0`` (always, for the losses above outside their quadratic zone)
    both are scaled by ``sqrt(rho')``; otherwise ``r~ = sqrt(rho')/(1 - alpha) r`` and
    ``J~ = sqrt(rho') (I - alpha r r^T / s) J`` with ``alpha`` the smaller root of
    ``alpha^2/2 - alpha - rho''/rho' s = 0``.
    """
    s = np.einsum("ij,ij->i", r, r)
    if loss.name == "trivial":
        return 0.5 * float(np.sum(s)), r, list(jacobians)
    rho0, rho1, rho2 = loss.evaluate(s)
    sqrt_rho1 = np.sqrt(rho1)
    full = (s > 0) & (rho2 > 0)
    residual_scaling = sqrt_rho1.copy()
    alpha_sq_norm = np.zeros_like(s)
    if full.any():
        d = 1.0 + 2.0 * s[full] * rho2[full] / rho1[full]
        alpha = 1.0 - np.sqrt(d)
        residual_scaling[full] = sqrt_rho1[full] / (1.0 - alpha)
        alpha_sq_norm[full] = alpha / s[full]
    out = []
    for J in jacobians:
        Jn = J * sqrt_rho1[:, None, None]
        if full.any():
            rtJ = np.einsum("ni,nik->nk", r, J)
            Jn = Jn - (sqrt_rho1 * alpha_sq_norm)[:, None, None] * r[:, :, None] * rtJ[:, None, :]
        out.append(Jn)
    return 0.5 * float(np.sum(rho0)), r * residual_scaling[:, None], out
