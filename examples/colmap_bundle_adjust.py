"""Bundle-adjust a COLMAP reconstruction with solvers.Problem, then add a residual of your own.

    python examples/colmap_bundle_adjust.py [MODEL_DIR] [--out OUT_DIR] [--frames 40] [--points 2000]

Without MODEL_DIR a small noisy reconstruction is made with pycolmap (``pip install pycolmap``).
The steps:

1. read the model (text or binary) and build the Problem COLMAP's bundle adjuster would solve
   (poses, shared intrinsics, points; the principal point held; the 7 gauge degrees of freedom
   removed as COLMAP's TWO_CAMS_FROM_WORLD gauge does), and solve it;
2. add a second residual kind, a prior on two camera centres, with a Huber loss, and solve again:
   any pyclad-traceable function of the parameter rows is a residual;
3. write the refined model back (``--out``), which COLMAP and pycolmap read.
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import numpy as np  # noqa: E402

import pyclad as pc  # noqa: E402
import solvers  # noqa: E402
from solvers import colmap  # noqa: E402


def synthetic_model(folder, frames=40, points=2000):
    try:
        import pycolmap
    except ImportError:
        raise SystemExit("no MODEL_DIR given and pycolmap is not installed to make one: pip install pycolmap")
    pycolmap.set_random_seed(0)
    rec = pycolmap.synthesize_dataset(pycolmap.SyntheticDatasetOptions(
        num_rigs=1, num_cameras_per_rig=1, num_frames_per_rig=frames, num_points3D=points, track_length=6,
        num_points2D_without_point3D=0))
    pycolmap.synthesize_noise(pycolmap.SyntheticNoiseOptions(
        point2D_stddev=1.0, point3D_stddev=0.02, rig_from_world_translation_stddev=0.01,
        rig_from_world_rotation_stddev=0.2), rec)
    rec.write(folder)
    return folder


SIGMA = 0.05     # the position measurement's standard deviation, in the scene's units


def centre_prior(pose, centre):
    """The camera centre -R^T t minus a measured position (e.g. GPS), in standard deviations:
    3 residuals."""
    c = -pc.rotate_angle_axis(-pose[0:3], pose[3:6])
    return [(c[i] - centre[i]) / SIGMA for i in range(3)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", help="COLMAP model folder (default: a synthetic one)")
    ap.add_argument("--out", help="folder to write the refined model to")
    ap.add_argument("--frames", type=int, default=40, help="images of the synthetic model (default 40)")
    ap.add_argument("--points", type=int, default=2000, help="points of the synthetic model (default 2000)")
    args = ap.parse_args()
    folder = args.model or synthetic_model(tempfile.mkdtemp(prefix="colmap-example-"), args.frames, args.points)

    rec = colmap.read_model(folder)
    print(f"{folder}: {rec.image_ids.size} images, {rec.point_ids.size} points, {rec.num_observations} observations")
    prob = colmap.problem_from_reconstruction(rec, refine_focal_length=True, refine_principal_point=False,
                                              refine_extra_params=True, fix="gauge")
    print(prob)
    result = solvers.solve(prob, linear_solver="sparse_schur", eliminate="points", verbose=True)
    print(result.brief_report())

    # A second residual kind: priors on the centres of two cameras (here: their solved centres,
    # moved by 0.2 along every axis), robust to a bad measurement.
    poses = result.parameters["poses"]
    rows = np.array([2, 5])
    R_inv_t = np.array([-_rotate(-p[:3], p[3:]) for p in poses[rows]])
    prob.add_residual_block(centre_prior, ["poses"], index=(rows,), data=R_inv_t + 0.2, loss="huber",
                            loss_scale=3.0, name="centre_prior")
    prob.set_parameters(result.parameters)          # start from the first solution
    again = solvers.solve(prob, verbose=False)
    print("with centre priors:", again.brief_report())

    colmap.update_reconstruction(rec, again)
    if args.out:
        colmap.write_model(rec, args.out, binary=True)
        print(f"written: {args.out}")


def _rotate(w, x):
    from solvers.models.rotation import rotate
    return rotate(w[None], x[None])[0]


if __name__ == "__main__":
    main()
