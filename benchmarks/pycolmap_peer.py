"""The pycolmap peer of ``python -m solvers.colmap MODEL_DIR``: one process that reads a COLMAP
model, bundle-adjusts it with COLMAP's own adjuster (Ceres) and writes it back, as ours does.

    python benchmarks/pycolmap_peer.py MODEL_DIR [--out OUT_DIR] [--threads N]

The options are those of ``python -m solvers.colmap``'s defaults and of bench_colmap.py's
``pycolmap_solve``: focal length and extra parameters refined, principal point fixed, trivial
loss, gauge TWO_CAMS_FROM_WORLD, Levenberg-Marquardt with tolerances 1e-6 / 1e-10 / 1e-8, at
most 50 iterations, ``--threads`` (default every core). Prints one JSON object (final cost in
Ceres' units, 1/2 sum of squared pixel residuals, as ours). It imports nothing but pycolmap, so
a timed process holds only what a pycolmap user's would.
"""
import argparse
import json
import os
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--out", help="folder to write the refined model to (made if missing)")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--iterations", type=int, default=50)
    a = p.parse_args(argv)
    import pycolmap

    rec = pycolmap.Reconstruction(a.model)
    opts = pycolmap.BundleAdjustmentOptions(print_summary=False)
    opts.refine_focal_length, opts.refine_principal_point, opts.refine_extra_params = True, False, True
    opts.ceres.loss_function_type = pycolmap.LossFunctionType.TRIVIAL
    so = opts.ceres.solver_options
    so.max_num_iterations, so.function_tolerance = a.iterations, 1e-6
    so.gradient_tolerance, so.parameter_tolerance, so.num_threads = 1e-10, 1e-8, a.threads
    cfg = pycolmap.BundleAdjustmentConfig()
    for i in sorted(rec.reg_image_ids()):
        cfg.add_image(i)
    cfg.fix_gauge(pycolmap.BundleAdjustmentGauge.TWO_CAMS_FROM_WORLD)
    t0 = time.perf_counter()
    cs = pycolmap.create_default_bundle_adjuster(opts, cfg, rec).solve().ceres_summary
    solve_s = time.perf_counter() - t0
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        rec.write(a.out)
    print(json.dumps({"initial_cost": cs.initial_cost, "final_cost": cs.final_cost,
                      "iterations": cs.num_successful_steps + cs.num_unsuccessful_steps,  # with iteration 0
                      "termination": str(cs.termination_type).split(".")[-1], "solve_s": solve_s,
                      "ceres_total_s": cs.total_time_in_seconds,
                      "linear_solver": str(cs.linear_solver_type_used).split(".")[-1],
                      "threads": a.threads, "pycolmap": pycolmap.__version__}))
    return 0 if cs.IsSolutionUsable() else 1


if __name__ == "__main__":
    sys.exit(main())
