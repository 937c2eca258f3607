"""The committed benchmark result files, as the documentation reads them: which file is the
latest run of each measurement, their rows, and Markdown tables whose every figure links to the
file it comes from. :mod:`plots` (``python benchmarks/plots.py``) uses it for the performance
pages; kept apart so the drawing reads on its own."""
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run from a checkout without installing

from solvers.io.atomic import replacing  # noqa: E402
RESULTS = os.path.join(ROOT, "benchmarks", "results")
TABLES = os.path.join(ROOT, "docs", "snippets", "perf")    # where table() writes; plots.main may move it

# The latest run of each measurement (the runs before them are superseded and not shown).
LATEST = {
    "ba_cpu": "bench_bundle_adjust-pocl-zen5",
    "convergence_cpu": "bench_convergence-pocl-full",
    "convergence_gpu": "bench_convergence-nvidia-full",
    "ba_gpu_bal": "bench_bundle_adjust-nvidia-full-run4",
    "ba_gpu_venice": "bench_bundle_adjust-nvidia-venice-run6",
    # sparse_schur with the mixed-precision default, Ceres' SPARSE_SCHUR in the same run (the run
    # above's sparse_schur rows are superseded by it; its iterative_schur rows are not)
    "ba_gpu_venice_sparse": "bench_bundle_adjust-h200-venice-mixed",
    # venice size with the current dense solves (super-block inverses), Ceres in the same run,
    # on the H100 lent for it; the H200 run above is of the solves before them
    "ba_gpu_venice_h100": "bench_bundle_adjust-h100-venice-super-inverse",
    "ba_gpu_final": "bench_bundle_adjust-nvidia-scale-wide-staging",
    "colmap_cpu": "bench_colmap-pocl-full",
    "colmap_cpu_2000": "bench_colmap-pocl-2000",
    "colmap_cpu_rigs": "bench_colmap-pocl-rigs-fisheye",
    "colmap_cpu_priors": "bench_colmap-pocl-priors",
    "colmap_gpu": "bench_colmap-nvidia-full",
    "colmap_gpu_2000": "bench_colmap-nvidia-2000",
    "colmap_gpu_rigs": "bench_colmap-nvidia-rigs",
    "colmap_gpu_priors": "bench_colmap-nvidia-priors",
    "colmap_gpu_fisheye": "bench_colmap-nvidia-fisheye.log",
    # the current kernels with the official op in the same run, on the H100 lent for it (the
    # H200 runs are of earlier kernels, superseded)
    "dcnv4": "bench_dcnv4-as-called-h100-hit-masks",
    "aggregation": "bench_deformable_aggregation-as-called-nvidia-full",
    "torch": "bench_torch_interop-nvidia-full",
    "warp_gpu": "bench_warpaffine-nvidia-full",
    "warp_cpu": ["bench_warpaffine-pocl-zen5-run4.md", "bench_warpaffine-pocl-zen5-run5.md",
                 "bench_warpaffine-pocl-zen5-run6.md", "bench_warpaffine-pocl-zen5-run7.md"],
    "overhead_gpu": "bench_call_overhead-nvidia-full",
    "overhead_cpu": "bench_call_overhead-pocl-zen5",
    "jacobian_cpu": "bench_jacobian-pocl-full",
    "jacobian_cpu_d16": "bench_jacobian-pocl-dubrovnik16",
    "jacobian_gpu": "bench_jacobian-nvidia-full",
    "tape_cpu": "bench_tape-pocl-full",
    "tape_gpu": "bench_tape-nvidia-full",
    "compile_cpu": "bench_compile_time-pocl-full",
    "cold_gpu": "bench_cold_start-nvidia-phases",
    # the 2-core CPU's --quick run (five processes each), kept under this name: *-quick.* is ignored
    "cold_cpu": "bench_cold_start-pocl-2core-fast-exit",
}


def load(name):
    with open(os.path.join(RESULTS, name + ".json")) as f:
        return json.load(f)


def rows(name, **match):
    return [r for r in load(name)["rows"] if all(r.get(k) == v for k, v in match.items())]


def link(name):
    """A Markdown link from a performance page to the result file (its table, where there is one)."""
    file = name if os.path.splitext(name)[1] in (".md", ".log") else name + ".md"
    if not os.path.exists(os.path.join(RESULTS, file)):
        file = name + ".json"
    return f"[{file}](../results/{file})"


def gpu(name):
    """The short name of the GPU a run had ("H100", "H200", ...), from its meta's device."""
    device = load(name)["meta"].get("device", "?")
    return next((w for w in device.split() if w[:1] in "HABL" and w[1:].isdigit()), device)


def meta(name):
    m = load(name)["meta"]
    return f"{m.get('device', '?')}, {m.get('when', '?')[:10]}: `python benchmarks/{m.get('command', '?')}`"


def fmt(x, digits=3):
    if x is None or x == "":
        return "-"
    if isinstance(x, str):
        return x
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def table(file, header, body, sources):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in body]
    lines += ["", "Source: " + ", ".join(link(s) for s in sources) + "."]
    for s in sources:
        if not s.endswith((".md", ".log")):
            lines.append(f"<br>{link(s)}: {meta(s)}")
    write_text(os.path.join(TABLES, file), "\n".join(lines) + "\n")


def write_text(path, text):
    """``text`` into ``path`` whole or not at all (solvers.io.atomic): a run stopped part-way
    leaves the old table, or the old README, as it was."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with replacing(path, "w") as f:
        f.write(text)


def kv_log(name):
    """The rows of a raw benchmark log: lines of ``key=value`` pairs separated by two spaces."""
    out = []
    with open(os.path.join(RESULTS, name)) as f:
        for line in f:
            if "case=" in line:
                pairs = (p.split("=", 1) for p in re.split(r"\s{2,}", line.strip()) if "=" in p)
                out.append({k: _number(v) for k, v in pairs})
    return out


def md_rows(name):
    """The rows of a result file's Markdown table, as dicts (for runs kept only as Markdown)."""
    with open(os.path.join(RESULTS, name)) as f:
        lines = [l.strip() for l in f if l.startswith("|")]
    keys = [k.strip() for k in lines[0].strip("|").split("|")]
    return [dict(zip(keys, (_number(c.strip()) for c in l.strip("|").split("|")))) for l in lines[2:]]


def _number(s):
    try:
        return float(s)
    except ValueError:
        return s
