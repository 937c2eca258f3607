"""Robust losses against independent formulas and complex-step derivatives; Ceres' correction."""
import cmath
import math

import numpy as np
import pytest

import solvers
from solvers.models.loss import Loss, correct

from reference_snavely import ReferenceSnavelyModel


def rho_reference(name, s, a):
    """The losses as written in Ceres' documentation, one value at a time (real or complex s)."""
    b = a * a
    if name == "trivial":
        return s
    if name == "huber":
        return s if s.real <= b else 2 * a * cmath.sqrt(s) - b
    if name == "soft_l1":
        return 2 * b * (cmath.sqrt(1 + s / b) - 1)
    if name == "cauchy":
        return b * cmath.log(1 + s / b)
    raise ValueError(name)


def complex_step(f, s, h=1e-30):
    return f(s + 1j * h).imag / h


@pytest.mark.parametrize("name", ["trivial", "huber", "soft_l1", "cauchy"])
@pytest.mark.parametrize("scale", [0.5, 1.0, 3.0])
def test_rho_and_derivatives(name, scale):
    s = np.array([0.0, 1e-6, 0.1, 0.24, 0.26, 1.0, 2.5, 8.9, 9.1, 100.0, 1e6])
    rho0, rho1, rho2 = Loss(name, scale).evaluate(s)
    for i, si in enumerate(s):
        assert rho0[i] == pytest.approx(rho_reference(name, complex(si), scale).real, rel=1e-13, abs=1e-300)
        d1 = complex_step(lambda z: rho_reference(name, z, scale), si)
        assert rho1[i] == pytest.approx(d1, rel=1e-10)
        if name == "huber" and abs(si - scale * scale) < 1e-12:
            continue
        # Second derivative: complex step of the complex-step first derivative's formula is not
        # available, so central differences of rho' (smooth away from Huber's kink).
        h = 1e-6 * max(si, 1e-3)
        if si - h < 0 or (name == "huber" and (si - h) <= scale * scale < (si + h)):
            continue
        d2 = (complex_step(lambda z: rho_reference(name, z, scale), si + h) -
              complex_step(lambda z: rho_reference(name, z, scale), si - h)) / (2 * h)
        assert rho2[i] == pytest.approx(d2, rel=1e-5, abs=1e-12)


def test_loss_arguments():
    with pytest.raises(ValueError, match="not one of"):
        Loss("tukey")
    with pytest.raises(ValueError, match="positive"):
        Loss("huber", 0.0)
    assert Loss(None).name == "trivial" and Loss("soft-l1", 2).name == "soft_l1"


class PositiveCurvatureLoss(Loss):
    """rho(s) = s + 0.1 s^2 (rho'' > 0): exercises the full Triggs correction branch."""

    def __init__(self):
        super().__init__("trivial")
        self.name = "test_positive"

    def evaluate(self, s):
        return s + 0.1 * s * s, 1 + 0.2 * s, np.full_like(s, 0.2)

    def cost(self, s):
        return 0.5 * float(np.sum(self.evaluate(s)[0]))


@pytest.mark.parametrize("loss", [Loss("huber", 1.0), Loss("cauchy", 2.0), Loss("soft_l1", 0.7),
                                  PositiveCurvatureLoss()], ids=lambda l: l.name)
def test_correction_keeps_gradient_and_gauss_newton_hessian(loss):
    rng = np.random.default_rng(0)
    n = 50
    r = rng.standard_normal((n, 2)) * np.linspace(0.1, 5, n)[:, None]
    r[0] = 0.0
    J1, J2 = rng.standard_normal((n, 2, 9)), rng.standard_normal((n, 2, 3))
    cost, rc, (j1c, j2c) = correct(loss, r, [J1, J2])
    s = np.sum(r * r, axis=1)
    rho0, rho1, rho2 = loss.evaluate(s)
    assert cost == pytest.approx(0.5 * rho0.sum(), rel=1e-14)
    for J, Jc in ((J1, j1c), (J2, j2c)):
        # Gradient of 1/2 rho(|r|^2) is rho' J^T r.
        np.testing.assert_allclose(np.einsum("nki,nk->ni", Jc, rc), rho1[:, None] * np.einsum("nki,nk->ni", J, r),
                                   rtol=1e-10, atol=1e-12)
        # Gauss-Newton Hessian: J^T (rho' I + 2 rho'' r r^T) J where rho'' > 0, rho' J^T J elsewhere.
        curv = np.where(rho2 > 0, rho2, 0.0)
        M = rho1[:, None, None] * np.eye(2) + 2 * curv[:, None, None] * r[:, :, None] * r[:, None, :]
        want = np.einsum("nki,nkl,nlj->nij", J, M, J)
        got = np.einsum("nki,nkj->nij", Jc, Jc)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-10)


def outlier_problem(seed=0):
    p = solvers.synthetic_problem(8, 300, 4, seed=seed, noise_px=0.3)
    truth = solvers.synthetic_problem(8, 300, 4, seed=seed, noise_px=0.0, perturb_rotation=0,
                                      perturb_translation=0, perturb_point=0)
    rng = np.random.default_rng(seed + 100)
    bad = rng.choice(p.num_observations, size=p.num_observations // 20, replace=False)
    obs = p.observations.copy()
    obs[bad] += rng.uniform(20, 60, size=(bad.size, 2)) * rng.choice([-1, 1], size=(bad.size, 2))
    inlier = np.ones(p.num_observations, bool)
    inlier[bad] = False
    return solvers.BALProblem(p.cameras, p.points, p.camera_index, p.point_index, obs), truth, inlier


@pytest.mark.parametrize("loss", ["huber", "cauchy", "soft_l1"])
def test_robust_losses_resist_outliers(device, loss):
    problem, truth, inlier = outlier_problem()
    plain = solvers.bundle_adjust(problem, device=device, handle_sigint=False)
    robust = solvers.bundle_adjust(problem, loss=loss, loss_scale=1.0, device=device, handle_sigint=False)
    assert robust.usable and np.all(np.isfinite(robust.points))
    ref = ReferenceSnavelyModel(problem.camera_index, problem.point_index, problem.observations)
    # The reported cost is 1/2 sum rho(|r|^2) at the returned parameters (independent evaluation).
    r = ref.residuals(robust.cameras, robust.points)
    s = np.sum(r * r, axis=1)
    want = 0.5 * sum(rho_reference(loss, complex(si), 1.0).real for si in s)
    assert robust.final_cost == pytest.approx(want, rel=1e-9)
    assert robust.final_cost < robust.initial_cost
    # Inliers are fitted far better than by plain least squares, which the outliers drag away.
    def inlier_rms(res):
        rr = ref.residuals(res.cameras, res.points)[inlier]
        return math.sqrt(np.mean(np.sum(rr * rr, axis=1)))
    assert inlier_rms(plain) > 5.0
    assert inlier_rms(robust) < 0.25 * inlier_rms(plain)
    if loss == "cauchy":   # redescending: ignores the outliers, converges to the noise level
        assert robust.converged and inlier_rms(robust) < 0.5
