"""Fused letterbox preprocessing (warp + BGR->RGB + /255 + HWC->CHW) against OpenCV's CPU pipeline.

Cases: one 1920x1080 BGR image -> 640x640 blob, and a batch of 16. Rows:
- opencv: cv2.warpAffine (INTER_LINEAR, BORDER_CONSTANT 114) + cv2.dnn.blobFromImage(s)
  (swapRB, 1/255, planar), wall clock, OpenCV's default threads (all cores of this machine);
- kernel: the letterbox kernel alone, input already on the device, into a reused output
  (OpenCL profiling events); also with other pixels-per-work-item mappings than the default;
- end-to-end: numpy in, numpy out: upload, kernel, download (wall clock), into a new array
  each run (as OpenCV returns one) and into a reused one (out=). On a CPU device the new
  array is a host mapping of a pooled buffer, so it costs no page faults once the pool holds
  one; OpenCV's is fresh numpy memory, whose first touch is part of its time.
bytes_moved counts each source image once plus the float32 blob written; frac_of_peak is
that rate over the 4.26 TB/s an OpenCL copy reaches on the H200 (meaningful there only).
Before timing, the blob is checked against OpenCV's: within one level everywhere. The
variants take turns, one run each per round (--repeat rounds after --warmup), so that load
from other work on a shared machine falls on all of them alike; medians over the rounds.
"""
import importlib
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (puts the repository root on the path too)

import cv2  # noqa: E402
import pyopencl.array as cla  # noqa: E402

import clkernels  # noqa: E402
# The module (clkernels.warp_affine is the function of the same name).
wa = importlib.import_module("clkernels.warp_affine")
wa_ops = importlib.import_module("clkernels.warp_affine.ops")   # its per-device choices, overridden below

PEAK_BYTES_PER_S = harness.H200_COPY_BYTES_PER_S
SRC_W, SRC_H, DST = 1920, 1080, 640


def opencv_pipeline(images):
    i2d = wa.letterbox_matrix((SRC_W, SRC_H), (DST, DST))
    warped = [cv2.warpAffine(im, i2d, (DST, DST), flags=cv2.INTER_LINEAR,
                             borderMode=cv2.BORDER_CONSTANT, borderValue=(114, 114, 114))
              for im in images]
    return cv2.dnn.blobFromImages(warped, 1 / 255, swapRB=True)


def stats(t):
    """Median in milliseconds and the interquartile spread, as table columns."""
    return dict(ms=t.median * 1e3, iqr=f"{t.spread:.0%}")


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--batches", default=None,
                        help="comma-separated batch sizes (default 1,16; 1,4 with --quick)")
    args = parser.parse_args()
    report = harness.Report("bench_warpaffine", args, opencv=cv2.__version__,
                            opencv_threads=cv2.getNumThreads())
    runtime = report.runtime
    queue = runtime.queue
    rng = np.random.default_rng(0)
    default_lanes = wa_ops._lanes(runtime, DST)
    mappings = sorted({default_lanes, 4, 8, 16} if runtime.info.is_cpu else {default_lanes, 1, 2, 4})
    batches = ((1, 4) if args.quick else (1, 16)) if args.batches is None else \
        tuple(int(b) for b in args.batches.split(","))
    repeat = 3 if args.quick else args.repeat

    for n in batches:
        case = f"{n} x {SRC_W}x{SRC_H} -> {DST}x{DST}"
        batch = rng.integers(0, 256, (n, SRC_H, SRC_W, 3), dtype=np.uint8)
        bytes_moved = batch.nbytes + n * 3 * DST * DST * 4

        ref = opencv_pipeline(list(batch))
        ours, _ = clkernels.letterbox(batch, size=(DST, DST), device=runtime)
        diff = np.abs(ours.astype(np.float64) - ref)
        assert diff.max() <= 1 / 255 + 1e-6, f"differs from OpenCV by {diff.max() * 255} levels"
        same = float(np.mean(diff < 0.5 / 255))

        device_batch = cla.to_device(queue, batch)
        # Outputs reused across runs, as an inference loop would: a fresh 80 MB buffer per run
        # would time the page faults of its first touch on a CPU device, not the kernel.
        device_blob = cla.empty(queue, (n, 3, DST, DST), np.float32)
        host_blob = np.empty((n, 3, DST, DST), np.float32)

        def kernel(lanes):
            """The kernel alone, with ``lanes`` destination pixels per work-item."""
            def launch():
                saved, wa_ops._lanes = wa_ops._lanes, (lambda rt, w: lanes)
                try:
                    blob, _ = clkernels.letterbox(device_batch, size=(DST, DST), out=device_blob,
                                                  device=runtime)
                    return blob.events[-1]
                finally:
                    wa_ops._lanes = saved
            return launch

        # Every round runs every variant once, in turn (see the docstring).
        peer = "opencv warpAffine+blobFromImages"
        variants = {peer: ("wall", lambda: opencv_pipeline(list(batch)))}
        for lanes in mappings:
            tag = " (default)" if lanes == default_lanes else ""
            variants[f"kernel, {lanes} px/work-item{tag}"] = ("events", kernel(lanes))
        variants["end-to-end numpy -> new numpy"] = (
            "wall", lambda: clkernels.letterbox(batch, size=(DST, DST), device=runtime))
        variants["end-to-end numpy -> out= numpy"] = (
            "wall", lambda: clkernels.letterbox(batch, size=(DST, DST), out=host_blob, device=runtime))
        samples = {name: [] for name in variants}
        for round_ in range(args.warmup + repeat):
            for name, (clock, fn) in variants.items():
                timer = harness.time_events if clock == "events" else harness.time_wall
                sample = timer(fn, warmup=0, repeat=1).samples[0]
                if round_ >= args.warmup:
                    samples[name].append(sample)
        t_cv = harness.Timing(samples[peer])
        for name, (clock, _) in variants.items():
            t = harness.Timing(samples[name])
            extra = {}
            if clock == "events":
                extra["frac_of_peak"] = bytes_moved / t.median / PEAK_BYTES_PER_S
            if name.startswith("end-to-end"):
                extra["same_level_as_opencv"] = same
            report.add(case=case, variant=name, timing=t, bytes_moved=bytes_moved,
                       speedup=t_cv.median / t.median, **extra, **stats(t))

    report.write(["case", "variant", "ms", "iqr", "GB_per_s", "frac_of_peak", "speedup",
                  "same_level_as_opencv"])


if __name__ == "__main__":
    main()
