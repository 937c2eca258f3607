"""Position priors of images (GPS, a survey, another reconstruction), as COLMAP 4's pose-prior
bundle adjuster uses them (``pycolmap.create_pose_prior_bundle_adjuster``).

Each prior is an image's camera centre in a metric Cartesian frame, with a 3x3 covariance. Before
the solve the reconstruction is moved into the priors' frame by a similarity transform estimated
robustly (:func:`align`: RANSAC over camera centres and prior positions, inliers within
``sqrt(chi2_3(0.95) * median(trace(cov) / 3))``, refined on the inliers as Umeyama's least
squares); the priors then fix the gauge (no pose is held). Each becomes a residual
``L^T (prior - centre)`` with ``L`` the Cholesky factor of the covariance's inverse, so its cost is
half the squared Mahalanobis distance (COLMAP's ``CovarianceWeightedCostFunctor`` around
``AbsolutePosePositionPriorCostFunctor``), under the trivial loss or Cauchy's. Fewer than three
priors, or no similarity that explains three of them, and the solve runs without priors, with
COLMAP's gauge, as COLMAP does.

Unlike COLMAP the reconstruction is not re-centred for the solve: positions far from the origin
(ECEF) lose digits; convert them to a local frame (ENU) first, as COLMAP's mapper does.

Priors come as :class:`PosePriors`, from a text file (:func:`read_pose_priors`) or from pycolmap's
``PosePrior`` objects (:func:`PosePriors.from_pycolmap`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

# chi-square of 3 degrees of freedom at 95%: COLMAP's inlier threshold factor and its default
# scale of the prior's robust loss (the square root).
CHI2_3_95 = 7.814727903251179
DEFAULT_LOSS_SCALE = math.sqrt(CHI2_3_95)


@dataclasses.dataclass
class PosePriors:
    """Position priors of images: each image's camera centre in a metric Cartesian frame, with
    a 3x3 covariance (see the module docstring for how a solve uses them).

    Made directly, by :func:`read_pose_priors` or by :meth:`from_pycolmap`; passed as
    ``pose_priors=`` to ``problem_from_reconstruction`` or :func:`solvers.colmap.bundle_adjust`.
    The fields are converted on construction (the arrays are copies where a conversion needs
    one) and checked.

    Attributes:
        image_ids: ``(n,)`` int64, the COLMAP image id of each prior; an image has at most one.
        positions: ``(n, 3)`` float64, each image's camera centre (finite).
        covariances: ``(n, 3, 3)`` float64, each position's covariance (symmetric, positive
            definite), or all nine entries NaN where a prior has none: then the solve's
            ``prior_fallback_stddev`` stands in. None on construction: NaN for every prior.

    Raises:
        ValueError: shapes that do not reshape to those above, a position that is not finite,
            an image with two priors, or a covariance partly NaN, not symmetric or not positive
            definite.
    """
    image_ids: np.ndarray
    positions: np.ndarray
    covariances: np.ndarray

    def __post_init__(self):
        self.image_ids = np.asarray(self.image_ids, np.int64).reshape(-1)
        n = self.image_ids.size
        self.positions = np.asarray(self.positions, np.float64).reshape(n, 3)
        cov = np.full((n, 3, 3), np.nan) if self.covariances is None else self.covariances
        self.covariances = np.asarray(cov, np.float64).reshape(n, 3, 3)
        check(self)

    @classmethod
    def from_pycolmap(cls, priors) -> "PosePriors":
        """From a sequence of ``pycolmap.PosePrior`` (each attached to an image through its
        ``corr_data_id``, as COLMAP attaches them); priors without a position are left out.
        WGS84 priors (latitude, longitude in degrees, altitude in metres: what COLMAP's feature
        extractor reads from EXIF) become metres in the local ENU frame whose origin is the first
        prior, as COLMAP's mapper converts them (their covariances as given); a mix of WGS84 and
        Cartesian priors is refused, as there."""
        kept = [p for p in priors if p.has_position()]
        if not kept:
            return cls(np.zeros(0, np.int64), np.zeros((0, 3)), np.zeros((0, 3, 3)))
        systems = {p.coordinate_system.name for p in kept}
        positions = np.array([np.asarray(p.position, np.float64) for p in kept])
        if "WGS84" in systems:
            if len(systems) > 1:
                raise ValueError(f"pose priors in several coordinate systems ({', '.join(sorted(systems))}): "
                                 f"give them all in WGS84 or all Cartesian")
            positions = wgs84_to_enu(positions, positions[0])
        return cls(np.array([int(p.corr_data_id.id) for p in kept]), positions,
                   np.array([np.asarray(p.position_covariance, np.float64) for p in kept]))


# WGS84's ellipsoid: semi-major axis and flattening.
WGS84_A, WGS84_F = 6378137.0, 1.0 / 298.257223563


def wgs84_to_enu(lat_lon_alt, origin) -> np.ndarray:
    """(n, 3) latitudes and longitudes (degrees) and altitudes (metres) -> (n, 3) east, north, up
    in metres from ``origin`` (a latitude, longitude, altitude), through Earth-centred
    coordinates on the WGS84 ellipsoid."""
    def ecef(lla):
        lat, lon, h = np.radians(lla[..., 0]), np.radians(lla[..., 1]), lla[..., 2]
        e2 = WGS84_F * (2.0 - WGS84_F)
        n = WGS84_A / np.sqrt(1.0 - e2 * np.sin(lat) ** 2)
        return np.stack([(n + h) * np.cos(lat) * np.cos(lon), (n + h) * np.cos(lat) * np.sin(lon),
                         (n * (1.0 - e2) + h) * np.sin(lat)], -1)
    lla = np.asarray(lat_lon_alt, np.float64).reshape(-1, 3)
    o = np.asarray(origin, np.float64)
    lat, lon = np.radians(o[0]), np.radians(o[1])
    R = np.array([[-np.sin(lon), np.cos(lon), 0.0],
                  [-np.sin(lat) * np.cos(lon), -np.sin(lat) * np.sin(lon), np.cos(lat)],
                  [np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)]])
    return (ecef(lla) - ecef(o)) @ R.T


def check(priors: PosePriors) -> None:
    """ValueError naming the first prior that no solve can take: a position that is not finite,
    a covariance partly NaN, not symmetric or not positive definite, an image with two priors."""
    ids, pos, cov = priors.image_ids, priors.positions, priors.covariances
    bad = np.flatnonzero(~np.isfinite(pos).all(axis=1))
    if bad.size:
        raise ValueError(f"pose prior of image {ids[bad[0]]}: the position {pos[bad[0]].tolist()} is not finite")
    order = np.argsort(ids, kind="stable")
    twice = np.flatnonzero(ids[order][1:] == ids[order][:-1])
    if twice.size:
        raise ValueError(f"image {ids[order][twice[0]]} has two pose priors; give each image one")
    given = np.isfinite(cov).all(axis=(1, 2))
    partly = np.flatnonzero(~given & np.isfinite(cov).any(axis=(1, 2)))
    if partly.size:
        raise ValueError(f"pose prior of image {ids[partly[0]]}: its covariance is partly NaN; give all nine "
                         f"entries, or none (then the fallback standard deviation stands in)")
    for k in np.flatnonzero(given):
        c = cov[k]
        if not np.allclose(c, c.T, rtol=1e-9, atol=1e-12 * np.abs(c).max()):
            raise ValueError(f"pose prior of image {ids[k]}: the covariance is not symmetric ({c.tolist()})")
        if np.linalg.eigvalsh(c).min() <= 0:
            raise ValueError(f"pose prior of image {ids[k]}: the covariance is not positive definite "
                             f"(eigenvalues {np.linalg.eigvalsh(c).tolist()})")


def read_pose_priors(path: str) -> PosePriors:
    """Priors from the text file at ``path``, one image per line (``#`` starts a comment)::

        IMAGE_ID X Y Z                        # no covariance: the fallback standard deviation
        IMAGE_ID X Y Z SX SY SZ               # standard deviations along the axes
        IMAGE_ID X Y Z C11 C12 C13 C22 C23 C33    # the covariance's upper triangle

    Positions in a metric Cartesian frame (metres in a local ENU frame, say). A malformed line
    raises ValueError naming the file and the line. A COLMAP database (``*.db``) gives the priors
    it holds (pycolmap's ``Database.read_all_pose_priors``; WGS84 ones converted to ENU)."""
    if path.endswith(".db"):
        try:
            import pycolmap
        except ImportError as e:
            raise ImportError(f"{path}: reading a COLMAP database's pose priors needs pycolmap ({e})") from e
        import os
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no such COLMAP database")
        db = pycolmap.Database.open(path) if hasattr(pycolmap.Database, "open") else pycolmap.Database(path)
        try:
            return PosePriors.from_pycolmap(db.read_all_pose_priors())
        finally:
            db.close()
    ids, positions, covariances = [], [], []
    with open(path) as fh:
        for no, line in enumerate(fh, 1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            parts = text.split()
            try:
                iid = int(parts[0])
                v = np.array([float(x) for x in parts[1:]])
            except ValueError as e:
                raise ValueError(f"{path}: line {no}: expected IMAGE_ID X Y Z [SX SY SZ | C11 C12 C13 C22 C23 C33] "
                                 f"({e})") from None
            if v.size == 3:
                c = np.full((3, 3), np.nan)
            elif v.size == 6:
                c = np.diag(v[3:] ** 2)
            elif v.size == 9:
                c11, c12, c13, c22, c23, c33 = v[3:]
                c = np.array([[c11, c12, c13], [c12, c22, c23], [c13, c23, c33]])
            else:
                raise ValueError(f"{path}: line {no}: {v.size} numbers after the image id; expected 3 (X Y Z), "
                                 f"6 (and standard deviations) or 9 (and the covariance's upper triangle)")
            ids.append(iid)
            positions.append(v[:3])
            covariances.append(c)
    try:
        return PosePriors(np.array(ids, np.int64), np.array(positions).reshape(-1, 3),
                          np.array(covariances).reshape(-1, 3, 3))
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def umeyama(src, dst):
    """The similarity ``dst ~ s R src + t`` of least squares (Umeyama 1991): ``(s, R, t)``."""
    mu_s, mu_d = src.mean(axis=0), dst.mean(axis=0)
    a, b = src - mu_s, dst - mu_d
    cov = b.T @ a / len(src)
    U, D, Vt = np.linalg.svd(cov)
    S = np.eye(3)
    if np.linalg.det(U) * np.linalg.det(Vt) < 0:
        S[2, 2] = -1.0
    R = U @ S @ Vt
    var = np.mean(np.sum(a * a, axis=1))
    s = float(np.trace(np.diag(D) @ S) / var) if var > 0 else 1.0
    return s, R, mu_d - s * R @ mu_s


def align(centres, positions, max_error: float, seed: int = 0, confidence: float = 0.99,
          max_trials: int = 10_000) -> Optional[tuple]:
    """The similarity taking camera ``centres`` (n, 3) to prior ``positions`` (n, 3), robustly:
    RANSAC over triples (trials until ``confidence`` of a clean sample), the best consensus
    refined by least squares on its inliers until they no longer change. ``(s, R, t, inliers)``,
    or None with fewer than three inliers."""
    n = len(centres)
    if n < 3:
        return None
    rng = np.random.default_rng(seed)
    best, best_count, trials, k = None, 2, max_trials, 0
    while k < trials:
        k += 1
        pick = rng.choice(n, 3, replace=False)
        s, R, t = umeyama(centres[pick], positions[pick])
        inliers = np.sum((positions - (s * centres @ R.T + t)) ** 2, axis=1) <= max_error ** 2
        count = int(inliers.sum())
        if count > best_count:
            best, best_count = inliers, count
            ratio = count / n
            trials = min(max_trials, max(k, int(math.ceil(math.log(1 - confidence) /
                                                          math.log(max(1e-12, 1 - ratio ** 3))))))
    if best is None:
        return None
    inliers = best
    for _ in range(20):                 # local optimisation: refit on the inliers until stable
        s, R, t = umeyama(centres[inliers], positions[inliers])
        again = np.sum((positions - (s * centres @ R.T + t)) ** 2, axis=1) <= max_error ** 2
        if again.sum() < 3 or np.array_equal(again, inliers):
            break
        inliers = again
    return s, R, t, inliers


def inlier_threshold(covariances, fallback_stddev: float) -> float:
    """COLMAP's: ``sqrt(chi2_3(0.95) * median(trace(cov) / 3))`` over the priors with a covariance
    (trace > 0), else from the fallback standard deviation."""
    given = np.isfinite(covariances).all(axis=(1, 2))
    traces = np.trace(covariances[given], axis1=1, axis2=2) if given.any() else np.zeros(0)
    traces = traces[traces > 0]
    var = float(np.median(traces / 3.0)) if traces.size else fallback_stddev ** 2
    return math.sqrt(CHI2_3_95 * var)


def sqrt_information(covariances, fallback_stddev: float) -> np.ndarray:
    """``L`` (n, 3, 3), lower, with ``L L^T`` the inverse covariance (the fallback's where a prior
    has none): the residual ``L^T (prior - centre)`` weighs the distance as the covariance says."""
    cov = np.where(np.isfinite(covariances).all(axis=(1, 2))[:, None, None], covariances,
                   fallback_stddev ** 2 * np.eye(3))
    return np.linalg.cholesky(np.linalg.inv(cov))


# -- the residuals (pyclad-traceable) -------------------------------------------------------
# data: the prior's position (3), then L row by row (9): the residual is L^T (prior - centre).

def _weighted(data, c):
    d = [data[i] - c[i] for i in range(3)]
    return [data[3 + i] * d[0] + data[6 + i] * d[1] + data[9 + i] * d[2] for i in range(3)]


def position_prior(pose, data):
    """The prior on the centre ``-R^T t`` of an image's ``cam_from_world`` (angle-axis, t)."""
    import pyclad as pc
    centre = pc.rotate_angle_axis(-pose[0:3], -pose[3:6])
    return _weighted(data, centre)


def rig_position_prior(sensor, frame, data):
    """The prior on the centre of an image of a rig: ``cam_from_world = sensor_from_rig *
    rig_from_world``, whose centre is ``-R_f^T (t_f + R_s^T t_s)``."""
    import pyclad as pc
    in_rig = frame[3:6] + pc.rotate_angle_axis(-sensor[0:3], sensor[3:6])
    centre = pc.rotate_angle_axis(-frame[0:3], -in_rig)
    return _weighted(data, centre)


def as_pose_priors(pose_priors) -> PosePriors:
    """:class:`PosePriors` of what ``problem_from_reconstruction(pose_priors=...)`` takes: a
    PosePriors, a file (:func:`read_pose_priors`) or pycolmap ``PosePrior`` objects."""
    if isinstance(pose_priors, PosePriors):
        return pose_priors
    if isinstance(pose_priors, str):
        return read_pose_priors(pose_priors)
    try:
        items = list(pose_priors)
    except TypeError:
        items = None
    if items is not None and all(hasattr(p, "corr_data_id") for p in items):
        return PosePriors.from_pycolmap(items)
    raise TypeError(f"pose_priors must be a solvers.colmap.PosePriors, a prior file's path or pycolmap PosePrior "
                    f"objects, got {type(pose_priors).__name__}")
