"""COLMAP model files read and written: ``solvers.colmap.read_model``/``write_model`` against
pycolmap's ``Reconstruction.read_binary``/``read_text``/``write_binary``/``write_text`` in the same
run, wall clock around each call, medians after a warm-up (the files' pages are in the OS cache
for both sides alike).

The models are ``bench_colmap.reconstruction`` (pycolmap's synthetic dataset, a camera per image),
written by pycolmap in both formats first, untimed. Our writes are whole: the model validated,
written into a new folder and swapped in, fsynced (:func:`solvers.colmap.write_model`); pycolmap
writes into an existing folder, without fsync. ``--images``: the model sizes.

    python benchmarks/bench_colmap_io.py [--images 200] [--repeat 5]
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

try:
    import pycolmap
    import bench_colmap
except (ImportError, SystemExit) as e:     # pycolmap writes the models and is the peer
    sys.exit(f"bench_colmap_io needs pycolmap: {e}")

from solvers import colmap  # noqa: E402


def main():
    p = harness.parser(__doc__)
    p.add_argument("--images", default="200", help="comma-separated model sizes in images")
    p.set_defaults(repeat=5, warmup=1)
    args = p.parse_args()
    report = harness.Report("bench_colmap_io", args, pycolmap=pycolmap.__version__)
    tmp = tempfile.mkdtemp(prefix="bench_colmap_io-")
    try:
        for n in (int(v) for v in args.images.split(",") if v):
            rec = bench_colmap.reconstruction(n, "per-image")
            for binary in (True, False):
                form = "binary" if binary else "text"
                src = os.path.join(tmp, f"{n}-{form}")
                os.makedirs(src)
                (rec.write_binary if binary else rec.write_text)(src)
                size = sum(os.path.getsize(os.path.join(src, f)) for f in os.listdir(src))
                case = f"{n} images, {rec.num_points3D()} points, {form} ({size / 1e6:.0f} MB)"
                peer = pycolmap.Reconstruction()
                t_ours = harness.time_wall(lambda: colmap.read_model(src), args.warmup, args.repeat)
                t_peer = harness.time_wall(lambda: (peer.read_binary if binary else peer.read_text)(src),
                                           args.warmup, args.repeat)
                report.add(case=case, variant="read: ours (read_model)", timing=t_ours,
                           x_peer=round(t_ours.median / t_peer.median, 2))
                report.add(case=case, variant="read: pycolmap", timing=t_peer)
                ours_rec = colmap.read_model(src)
                out_ours, out_peer = os.path.join(tmp, f"o-{form}"), os.path.join(tmp, f"p-{form}")
                os.makedirs(out_peer, exist_ok=True)
                t_ours = harness.time_wall(lambda: colmap.write_model(ours_rec, out_ours, binary=binary),
                                           args.warmup, args.repeat)
                t_peer = harness.time_wall(lambda: (rec.write_binary if binary else rec.write_text)(out_peer),
                                           args.warmup, args.repeat)
                report.add(case=case, variant="write: ours (write_model)", timing=t_ours,
                           x_peer=round(t_ours.median / t_peer.median, 2))
                report.add(case=case, variant="write: pycolmap", timing=t_peer)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report.write()


if __name__ == "__main__":
    main()
