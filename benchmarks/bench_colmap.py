"""COLMAP bundle adjustment: ``solvers.solve`` on ``solvers.colmap.problem_from_reconstruction``
against ``pycolmap``'s own bundle adjuster (COLMAP's Ceres problem), in the same run.

Reconstructions come from ``pycolmap.synthesize_dataset`` with ``pycolmap.synthesize_noise``
(2-D noise 1 px, 3-D noise 0.02, pose noise 0.01 / 0.2 deg), SIMPLE_RADIAL, at several sizes, with
one shared camera and with one camera per image; ``--cameras`` adds an OPENCV_FISHEYE camera per
image, one rig of 2 or 6 cameras (their sensor_from_rig poses refined, as pycolmap's defaults),
and a camera per image with position priors (``priors``: the model moved by a similarity, priors
of sigma 0.05 about the true centres; pycolmap's ``create_pose_prior_bundle_adjuster``). Both sides: the same loss (trivial), the same
refined intrinsics (focal length and extra parameters; principal point fixed), the same gauge
(COLMAP's TWO_CAMS_FROM_WORLD: the first pose and the largest coordinate of the second pose's
translation), Levenberg-Marquardt with tolerances 1e-6 / 1e-10 / 1e-8, at most 50 iterations,
and pycolmap on every core of the machine. Timed: the solve alone (ours: ``solvers.solve`` on a
built Problem, reading excluded; pycolmap: ``BundleAdjuster.solve()``), after one warm-up solve
of each case and linear solver (kernel builds: a size can take another kernel variant), median
of ``--repeat`` runs (``--repeat-large`` above 200,000 observations). Reported: both final costs in
the same units (Ceres' cost, 1/2 sum of squared pixel residuals), iterations, wall times and
their ratio, and ours split into Jacobian evaluation, linear solver and the rest of the
minimizer (``other_s``: the state's setup, index and allocations, and the iterations' own work).

    python benchmarks/bench_colmap.py [--quick] [--device SPEC] [--sizes 30,100,...] [--repeat N]
"""
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))


import harness  # noqa: E402

try:
    import pycolmap  # noqa: E402
except ImportError:
    raise SystemExit("bench_colmap needs pycolmap (pip install pycolmap, or pip install '.[test]')")

import solvers  # noqa: E402
from solvers import colmap  # noqa: E402

TRACK = 8
POINTS_PER_IMAGE = 60       # observations = images * 60 * 8


# The kinds of reconstruction (--cameras): (rigs, cameras per rig, frames per rig) for n images,
# and the camera model with its parameters.
SIMPLE_RADIAL = ("SIMPLE_RADIAL", [1280.0, 512.0, 384.0, 0.05])
OPENCV_FISHEYE = ("OPENCV_FISHEYE", [600.0, 610.0, 512.0, 384.0, 0.05, -0.01, 0.002, -0.001])
KINDS = {
    "shared": (lambda n: (1, 1, n), SIMPLE_RADIAL, "shared camera"),
    "per-image": (lambda n: (n, 1, 1), SIMPLE_RADIAL, "camera per image"),
    "fisheye": (lambda n: (n, 1, 1), OPENCV_FISHEYE, "OPENCV_FISHEYE camera per image"),
    "rig2": (lambda n: (1, 2, max(1, n // 2)), SIMPLE_RADIAL, "a rig of 2 cameras"),
    "rig6": (lambda n: (1, 6, max(1, n // 6)), SIMPLE_RADIAL, "a rig of 6 cameras"),
    # a camera per image, moved into another frame, with position priors from the unmoved one
    "priors": (lambda n: (n, 1, 1), SIMPLE_RADIAL, "camera per image, pose priors"),
}
PRIOR_SIGMA = 0.05


def reconstruction(n_images, kind, seed=0):
    """The synthetic reconstruction of ``kind`` (:data:`KINDS`) and ``n_images``, with noise."""
    return reconstruction_and_priors(n_images, kind, seed)[0]


def reconstruction_and_priors(n_images, kind, seed=0):
    """``(reconstruction, priors)``: priors (pycolmap PosePrior, sigma 0.05 about the true
    centres) for kind "priors", the reconstruction then moved by a similarity; else None."""
    rigs, cameras, frames = KINDS[kind][0](n_images)
    model, params = KINDS[kind][1]
    pycolmap.set_random_seed(seed)
    o = pycolmap.SyntheticDatasetOptions(
        num_rigs=rigs, num_cameras_per_rig=cameras, num_frames_per_rig=frames,
        num_points3D=POINTS_PER_IMAGE * n_images, track_length=TRACK, num_points2D_without_point3D=0,
        camera_model_id=getattr(pycolmap.CameraModelId, model), camera_params=params)
    rec = pycolmap.synthesize_dataset(o)
    priors = None
    if kind == "priors":
        import numpy as np
        rng = np.random.default_rng(seed)
        priors = []
        for image_id in sorted(rec.reg_image_ids()):
            p = pycolmap.PosePrior()
            p.corr_data_id = rec.image(image_id).data_id
            p.position = rec.image(image_id).projection_center() + rng.normal(0.0, PRIOR_SIGMA, 3)
            p.position_covariance = PRIOR_SIGMA ** 2 * np.eye(3)
            priors.append(p)
        rec.transform(pycolmap.Sim3d(0.3, pycolmap.Rotation3d(np.array([0.2, -0.1, 0.4])), np.array([5.0, -2.0, 1.0])))
    pycolmap.synthesize_noise(pycolmap.SyntheticNoiseOptions(
        point2D_stddev=1.0, point3D_stddev=0.02, rig_from_world_translation_stddev=0.01,
        rig_from_world_rotation_stddev=0.2), rec)
    return rec, priors


def pycolmap_solve(rec, threads, priors=None):
    rec = pycolmap.Reconstruction(rec)          # a copy: every run starts from the same state
    opts = pycolmap.BundleAdjustmentOptions(print_summary=False)
    opts.refine_focal_length, opts.refine_principal_point, opts.refine_extra_params = True, False, True
    opts.ceres.loss_function_type = pycolmap.LossFunctionType.TRIVIAL
    so = opts.ceres.solver_options
    so.max_num_iterations, so.function_tolerance = 50, 1e-6
    so.gradient_tolerance, so.parameter_tolerance, so.num_threads = 1e-10, 1e-8, threads
    cfg = pycolmap.BundleAdjustmentConfig()
    for i in sorted(rec.reg_image_ids()):
        cfg.add_image(i)
    if priors is None:
        cfg.fix_gauge(pycolmap.BundleAdjustmentGauge.TWO_CAMS_FROM_WORLD)
        adjuster = pycolmap.create_default_bundle_adjuster(opts, cfg, rec)
    else:       # aligned to the priors while being made, untimed (ours: in problem_from_reconstruction)
        po = pycolmap.PosePriorBundleAdjustmentOptions()
        po.alignment_ransac.random_seed = 0
        adjuster = pycolmap.create_pose_prior_bundle_adjuster(opts, po, cfg, priors, rec)
    t0 = time.perf_counter()
    cs = adjuster.solve().ceres_summary
    return time.perf_counter() - t0, cs


def ours_solve(prob, linear_solver, **options):
    t0 = time.perf_counter()
    r = solvers.solve(prob, linear_solver=linear_solver, max_iterations=50, function_tolerance=1e-6,
                      gradient_tolerance=1e-10, parameter_tolerance=1e-8, handle_sigint=False, **options)
    return time.perf_counter() - t0, r


def main():
    p = harness.parser(__doc__)
    p.add_argument("--sizes", default=None, help="numbers of images (default 30,100,300,1000,2000; --quick 30,100)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="pycolmap's threads (default: every core)")
    p.add_argument("--linear-solvers", default="auto",
                   help="ours: comma-separated (sparse_schur, iterative_schur), or auto (default): the kind "
                        "pycolmap chose for the case (COLMAP: ITERATIVE_SCHUR above 1,000 images)")
    p.add_argument("--cameras", default="shared,per-image",
                   help="comma-separated: shared, per-image, fisheye (OPENCV_FISHEYE per image), rig2, rig6 "
                        "(one rig of 2 or 6 cameras, n / 2 or n / 6 frames), priors (per image, pose priors)")
    p.add_argument("--repeat-large", type=int, default=1,
                   help="timed runs per side above 200,000 observations (default 1: minutes each)")
    p.set_defaults(repeat=3)
    args = p.parse_args()
    sizes = [int(v) for v in (args.sizes or ("30,100" if args.quick else "30,100,300,1000,2000")).split(",")]
    rep = harness.Report("bench_colmap", args, threads=args.threads, track_length=TRACK,
                         points_per_image=POINTS_PER_IMAGE)
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.cameras.split(","):
            if kind not in KINDS:
                raise SystemExit(f"--cameras: {kind!r} is not one of {', '.join(KINDS)}")
            for n in sizes:
                rec, priors = reconstruction_and_priors(n, kind)
                path = os.path.join(tmp, f"m{n}{kind}")
                os.makedirs(path)
                rec.write(path)
                ours_rec = colmap.read_model(path)
                prob = colmap.problem_from_reconstruction(ours_rec, device=args.device, pose_priors=priors)
                repeat = args.repeat if ours_rec.num_observations <= 200_000 else args.repeat_large
                peer = [pycolmap_solve(rec, args.threads, priors) for _ in range(repeat)]
                t_peer = statistics.median(t for t, _ in peer)
                cs = peer[0][1]
                chosen = "iterative_schur" if "ITERATIVE" in str(cs.linear_solver_type_used) else "sparse_schur"
                solvers_here = [chosen if ls == "auto" else ls for ls in args.linear_solvers.split(",")]
                for ls in solvers_here:
                    # Kernel builds (or pyopencl's cache of them) outside the timings: every case,
                    # since a size can take another variant (the dense Cholesky's solve, say).
                    ours_solve(prob, ls)
                    mine = [ours_solve(prob, ls) for _ in range(repeat)]
                    t_ours = statistics.median(t for t, _ in mine)
                    r = mine[0][1]
                    rep.add(f"{n} images, {KINDS[kind][2]}", ls,
                            observations=ours_rec.num_observations, ours_s=t_ours, pycolmap_s=t_peer,
                            time_ratio=t_ours / t_peer, ours_cost=r.final_cost, pycolmap_cost=cs.final_cost,
                            cost_ratio=r.final_cost / cs.final_cost, ours_iterations=r.iterations,
                            pycolmap_iterations=cs.num_successful_steps + cs.num_unsuccessful_steps - 1,
                            jacobian_s=r.times["jacobian_evaluation"], linear_s=r.times["linear_solver"],
                            other_s=r.times["other"],
                            core=r.core, state=r.state, runs=repeat,
                            pycolmap_solver=str(cs.linear_solver_type_used).split(".")[-1])
    rep.write(["case", "variant", "pycolmap_solver", "observations", "ours_s", "pycolmap_s", "time_ratio", "ours_cost",
               "pycolmap_cost", "cost_ratio", "ours_iterations", "pycolmap_iterations", "jacobian_s",
               "linear_s", "other_s", "core", "state"])


if __name__ == "__main__":
    main()
