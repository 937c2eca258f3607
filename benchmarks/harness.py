"""The one timing harness every benchmark uses.

- Kernel times come from OpenCL profiling events (``Report.runtime``'s queue has profiling
  on); peers (Ceres, OpenCV, numpy) are timed by wall clock around the call. Timings "as
  called" use ``Report.user_runtime`` instead: the library's default runtime on that device,
  whose queue records no timestamps, as a caller gets it.
- Each measurement: warm-up runs, then ``repeat`` runs; the median is reported with the
  interquartile spread, since the machines are shared and noisy.
- A :class:`Report` prints a human table and writes the same rows as JSON beside a
  Markdown copy, under ``benchmarks/results/`` or ``--out``/``$PYCLAD_BENCH_OUT``.

Usage in a benchmark script::

    args = harness.parser(__doc__).parse_args()
    report = harness.Report("bench_x", args)
    t = harness.time_events(lambda: launch(...), repeat=args.repeat)
    report.add(case="shape A", variant="gather", timing=t, bytes_moved=..., items=...)
    report.write()
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from typing import Callable, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # run from a checkout without installing

import pyopencl as cl  # noqa: E402

import clkernels  # noqa: E402
import numpy as np  # noqa: E402

# The bandwidth ceiling GPU kernels are quoted against: an OpenCL float4 copy (bytes read +
# written) on the H200 machine (../shared/device/README.md).
H200_COPY_BYTES_PER_S = 4.26e12


def rel_err(a, b) -> float:
    """Largest absolute difference relative to the largest magnitude of the reference ``b``."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


@dataclasses.dataclass
class Timing:
    samples: List[float]  # seconds

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def quantile(self, q: float) -> float:
        s = sorted(self.samples)
        pos = q * (len(s) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median."""
        return (self.quantile(0.75) - self.quantile(0.25)) / self.median if self.median else 0.0

    def as_dict(self):
        return {"median_s": self.median, "q25_s": self.quantile(0.25), "q75_s": self.quantile(0.75),
                "min_s": min(self.samples), "spread": self.spread, "runs": len(self.samples),
                "samples_s": self.samples}


def _event_span(events) -> float:
    events = events if isinstance(events, (list, tuple)) else [events]
    events = [e for e in events if e is not None]
    cl.wait_for_events(events)
    start = min(e.profile.start for e in events)
    end = max(e.profile.end for e in events)
    return (end - start) * 1e-9


def time_events(launch: Callable, warmup: int = 2, repeat: int = 10) -> Timing:
    """Time ``launch()``, which enqueues work and returns its event(s); the span from the
    first event's start to the last one's end, by the device's own clock."""
    for _ in range(warmup):
        _event_span(launch())
    return Timing([_event_span(launch()) for _ in range(repeat)])


def time_wall(fn: Callable, warmup: int = 1, repeat: int = 5) -> Timing:
    """Wall-clock time of ``fn()`` (which must finish its work before returning)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return Timing(samples)


def parser(doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None, help="device spec (default: PYCLAD_DEVICE or the default device)")
    p.add_argument("--repeat", type=int, default=10, help="timed runs per measurement (median reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs first")
    p.add_argument("--quick", action="store_true", help="smaller shapes and fewer runs, for a smoke test")
    p.add_argument("--out", default=os.environ.get("PYCLAD_BENCH_OUT", os.path.join(HERE, "results")),
                   help="folder for the JSON and Markdown results")
    return p


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


class Report:
    """Rows of one benchmark run, printed as they come and written at the end."""

    def __init__(self, name: str, args: argparse.Namespace, **meta):
        self.name, self.args = name, args
        # The default runtime is what a caller gets; its companion on the same context has a
        # profiling queue, for kernel events. Arrays of one serve the other.
        self.user_runtime = clkernels.get_runtime(args.device)
        runtime = self.runtime = self.user_runtime.profiled()
        self.meta = {"benchmark": name, "device": runtime.info.name, "platform": runtime.info.platform,
                     "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                     "when": time.strftime("%Y-%m-%d %H:%M:%S"), "repeat": args.repeat,
                     "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]), **meta}
        self.rows: List[dict] = []
        print(f"# {name} on {runtime.info.name} ({runtime.info.platform})", flush=True)

    def add(self, case: str, variant: str, timing: Optional[Timing] = None, **extra) -> dict:
        """One measurement. ``bytes_moved`` gives GB/s; ``items`` gives items/s."""
        row = {"case": case, "variant": variant, **extra}
        if timing is not None:
            row.update(timing.as_dict())
            if "bytes_moved" in extra:
                row["GB_per_s"] = extra["bytes_moved"] / timing.median / 1e9
            if "items" in extra:
                row["items_per_s"] = extra["items"] / timing.median
        self.rows.append(row)
        shown = {k: v for k, v in row.items() if k not in ("samples_s", "q25_s", "q75_s", "min_s", "runs", "spread")}
        if timing is not None:
            shown["median_ms"] = timing.median * 1e3
            shown["spread"] = f"{timing.spread:.1%}"
            shown.pop("median_s")
        print("  " + "  ".join(f"{k}={_fmt(v)}" for k, v in shown.items()), flush=True)
        return row

    def table(self, columns: List[str], rows: Optional[List[dict]] = None) -> str:
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        for row in self.rows if rows is None else rows:
            lines.append("| " + " | ".join(_fmt(row.get(c, "")) for c in columns) + " |")
        return "\n".join(lines)

    def write(self, columns: Optional[List[str]] = None, sections: Optional[dict] = None) -> str:
        """``sections``: {name: columns} for rows added with ``section=name``; each such group
        gets a table of its own after the main one (in the JSON all rows stay in one list)."""
        sections = sections or {}
        main = [r for r in self.rows if r.get("section") not in sections]
        columns = columns or sorted({k for r in main for k in r if k != "samples_s"},
                                    key=lambda k: (k not in ("case", "variant"), k))
        os.makedirs(self.args.out, exist_ok=True)
        tag = "".join(c if c.isalnum() else "-" for c in self.runtime.info.vendor + "-" +
                      ("quick" if getattr(self.args, "quick", False) else "full"))
        base = os.path.join(self.args.out, f"{self.name}-{tag}")
        # Whole files or none (solvers.io.atomic): a benchmark rewrites its results after every
        # case, and a run killed while writing keeps the last whole ones.
        from solvers.io.atomic import replacing
        with replacing(base + ".json", "w") as f:
            json.dump({"meta": self.meta, "rows": self.rows}, f, indent=1)
        parts = [self.table(columns, main)] if main or not sections else []
        for name, cols in sections.items():
            rows = [r for r in self.rows if r.get("section") == name]
            if rows:
                parts.append(f"## {name}\n\n" + self.table(cols, rows))
        table = "\n\n".join(parts)
        text = f"# {self.name}\n\n" + "\n".join(f"- {k}: {v}" for k, v in self.meta.items()) + \
               "\n\n" + table + "\n"
        with replacing(base + ".md", "w") as f:
            f.write(text)
        print("\n" + table)
        print(f"\nwritten: {base}.json and {base}.md")
        return base
