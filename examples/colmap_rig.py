"""Bundle-adjust a COLMAP 4 reconstruction taken by a multi-camera rig, in memory with pycolmap.

    python examples/colmap_rig.py [--cameras 4] [--frames 20]

A car-mounted rig of several cameras (pycolmap's synthetic dataset with noise) is adjusted as
pycolmap's default bundle adjuster adjusts it: every frame's ``rig_from_world`` and every
camera's ``sensor_from_rig`` are refined (the reference camera's is the identity), the images of
one frame share its pose. The pycolmap reconstruction is updated in place; no file is written.
Then the same with the rig calibration held (``refine_sensor_from_rig=False``), as for a rig
calibrated beforehand. Needs pycolmap (``pip install pycolmap``).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import numpy as np  # noqa: E402

from solvers import colmap  # noqa: E402


def rig_reconstruction(cameras, frames):
    import pycolmap
    pycolmap.set_random_seed(0)
    rec = pycolmap.synthesize_dataset(pycolmap.SyntheticDatasetOptions(
        num_rigs=1, num_cameras_per_rig=cameras, num_frames_per_rig=frames, num_points3D=60 * frames,
        track_length=6, camera_model_id=pycolmap.CameraModelId.OPENCV,
        camera_params=[600.0, 610.0, 512.0, 384.0, 0.02, -0.01, 0.001, -0.002]))
    pycolmap.synthesize_noise(pycolmap.SyntheticNoiseOptions(
        point2D_stddev=0.8, point3D_stddev=0.02, rig_from_world_translation_stddev=0.01,
        rig_from_world_rotation_stddev=0.2), rec)
    return rec


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cameras", type=int, default=4, help="cameras of the rig (default 4)")
    p.add_argument("--frames", type=int, default=20, help="frames the rig took (default 20)")
    args = p.parse_args()
    try:
        import pycolmap
    except ImportError:
        raise SystemExit("this example needs pycolmap: pip install pycolmap")
    for refine_sensor_from_rig in (True, False):
        rec = rig_reconstruction(args.cameras, args.frames)
        rig = rec.rigs[sorted(rec.rigs)[0]]
        before = {s.id: pose.translation.copy() for s, pose in rig.non_ref_sensors.items()}
        error = rec.compute_mean_reprojection_error()
        result = colmap.bundle_adjust(rec, refine_sensor_from_rig=refine_sensor_from_rig, max_iterations=50)
        moved = max(np.abs(pose.translation - before[s.id]).max() for s, pose in rig.non_ref_sensors.items())
        print(f"{args.cameras} cameras, {rec.num_frames()} frames, {rec.num_images()} images, "
              f"{rec.compute_num_observations()} observations; refine_sensor_from_rig={refine_sensor_from_rig}")
        print(f"  {result.brief_report()}")
        print(f"  mean reprojection error {error:.3f} px -> {rec.compute_mean_reprojection_error():.3f} px "
              f"(the points' errors recomputed); sensor_from_rig moved by up to {moved:.2e}")
    print(f"(pycolmap {pycolmap.__version__}; the reconstruction was updated in place, no file written)")


if __name__ == "__main__":
    main()
