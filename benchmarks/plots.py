"""Draw the documentation's plots and figure tables from the committed benchmark results.

    python benchmarks/plots.py            # writes docs/assets/plots/*.png and docs/snippets/perf/*.md
    python benchmarks/plots.py --no-plots --tables DIR    # the tables alone, elsewhere (the docs test)

Every number on the performance pages comes from here: the script reads the result files under
``benchmarks/results/`` (the latest run of each measurement, named in ``result_files.LATEST``), draws
the plots with matplotlib (Agg, no display) and writes each table as a Markdown snippet that the
pages include, with a link to the result file behind every row. Nothing is typed in by hand, so a
new run is a new file name in ``LATEST`` and a rerun of this script.
"""
import argparse
import os
import re
import sys

import result_files as rf
from result_files import LATEST, kv_log, link, load, md_rows, rows, table
from solvers.io.atomic import replacing  # result_files put the checkout on sys.path

ROOT = rf.ROOT
PLOTS = os.path.join(ROOT, "docs", "assets", "plots")
DRAW = True          # False with --no-plots: tables only

# ----------------------------------------------------------------------------- plots


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"figure.dpi": 110, "font.size": 9, "axes.grid": True, "grid.alpha": 0.3})
    return plt


def save(fig, name):
    if not DRAW:
        return
    os.makedirs(PLOTS, exist_ok=True)
    fig.tight_layout()
    with replacing(os.path.join(PLOTS, name)) as f:     # the old plot or the new one, whole
        fig.savefig(f, format="png")
    print("wrote", os.path.join("docs", "assets", "plots", name))


def _plain_log_ticks(axis):
    """Label a log axis 1, 2, 5, 10, 20, ... instead of powers of ten alone."""
    if not DRAW:
        return
    from matplotlib.ticker import FuncFormatter, LogLocator
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def bars(ax, labels, series, ylabel, log=True):
    import numpy as np
    x = np.arange(len(labels))
    w = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        ax.bar(x + (i - (len(series) - 1) / 2) * w, [v if v is not None else 0 for v in values], w, label=name)
    ax.set_xticks(x, labels, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=8)


# ----------------------------------------------------------------------------- bundle adjustment


def _ba_cases(name):
    """{case: {variant: row}} of a bench_bundle_adjust result, the warm-up rows left out."""
    out = {}
    for r in load(name)["rows"]:
        if r["case"] != "first-solve-in-process":
            out.setdefault(r["case"], {})[r["variant"]] = r
    return out


def bundle_adjustment(plt):
    cpu = _ba_cases(LATEST["ba_cpu"])
    body = []
    for case, v in cpu.items():
        for solver in ("sparse_schur", "iterative_schur"):
            p, c = v[f"pyclad-{solver}"], v[f"ceres-{solver}"]
            body.append([case, f"{p['observations']:,}", f"`{solver}`", p["median_s"], c["median_s"],
                         p["median_s"] / c["median_s"], f"{p['final_cost']:.6e}", f"{c['final_cost']:.6e}",
                         f"{p['iterations']}/{c['iterations']}"])
    table("ba_cpu.md", ["problem", "observations", "solver", "pyclad s", "Ceres s", "pyclad / Ceres",
                        "pyclad final cost", "Ceres final cost", "iterations (pyclad/Ceres)"],
          body, [LATEST["ba_cpu"]])

    gpu = {case: (v, v, LATEST["ba_gpu_bal"]) for case, v in _ba_cases(LATEST["ba_gpu_bal"]).items()}
    # venice size: sparse_schur and the ratio from the newer run (both sides in it), iterative_schur
    # from the older one, which the newer did not run.
    sparse = _ba_cases(LATEST["ba_gpu_venice_sparse"])
    for case, v in _ba_cases(LATEST["ba_gpu_venice"]).items():
        gpu[case] = ({**v, **sparse[case]}, sparse[case], link(LATEST["ba_gpu_venice_sparse"]) + " (sparse_schur, ratio), "
                     + link(LATEST["ba_gpu_venice"]) + " (iterative_schur)")
    body = []
    for case, (v, same_run, src) in gpu.items():
        t = {k: r["median_s"] for k, r in v.items()}
        ours = min(r["median_s"] for k, r in same_run.items() if k.startswith("pyclad-"))
        ceres = min(r["median_s"] for k, r in same_run.items() if k.startswith("ceres-"))
        body.append([case, f"{next(iter(v.values()))['observations']:,}", t.get("pyclad-sparse_schur"),
                     t.get("pyclad-iterative_schur"), t.get("ceres-sparse_schur"),
                     t.get("ceres-iterative_schur", "not run"), f"**{ceres / ours:.1f}x**",
                     src if src.startswith("[") else link(src)])
    for case, v in _ba_cases(LATEST["ba_gpu_final"]).items():
        r = v["pyclad-iterative_schur"]
        body.append([f"{case} ({r['iterations']} iterations)", f"{r['observations']:,}", "not run",
                     r["median_s"], "not run", "not run", "-", link(LATEST["ba_gpu_final"])])
    table("ba_gpu.md", ["problem", "observations", "pyclad `sparse_schur` s", "pyclad `iterative_schur` s",
                        "Ceres SPARSE_SCHUR s", "Ceres ITERATIVE_SCHUR s", "Ceres' best / pyclad's best", "source"],
          body, [LATEST["ba_gpu_bal"], LATEST["ba_gpu_venice_sparse"], LATEST["ba_gpu_venice"], LATEST["ba_gpu_final"]])

    gpu = {case: v for case, (v, _, _) in gpu.items()}

    # Time per problem: pyclad's and Ceres' best solver, both machines.
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, cases, title in ((axes[0], cpu, "2-core CPU (PoCL) against Ceres on 2 threads"),
                             (axes[1], gpu, "H200 against Ceres on 16 cores")):
        labels = [c.replace("-pre", "") for c in cases]
        best = lambda v, who: min(r["median_s"] for k, r in v.items() if k.startswith(who))
        bars(ax, labels, {"pyclad (best solver)": [best(v, "pyclad") for v in cases.values()],
                          "Ceres (best solver)": [best(v, "ceres") for v in cases.values()]}, "seconds per solve")
        ax.set_title(title)
    save(fig, "ba_time_per_problem.png")

    # Speed-up against problem size.
    fig, ax = plt.subplots(figsize=(7, 4))
    for cases, label, marker in ((cpu, "2-core CPU", "o"), (gpu, "H200", "s")):
        for solver in ("sparse_schur", "iterative_schur"):
            pts = sorted((v[f"pyclad-{solver}"]["observations"],
                          v[f"ceres-{solver}"]["median_s"] / v[f"pyclad-{solver}"]["median_s"])
                         for v in cases.values() if f"ceres-{solver}" in v and f"pyclad-{solver}" in v)
            if pts:   # markers only: each point is a different problem, not a sweep of one
                ax.plot(*zip(*pts), marker=marker, ls="none", ms=7, label=f"{label}, {solver}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log_ticks(ax.yaxis)
    ax.axhline(1, color="k", lw=0.8)
    ax.set_xlabel("observations")
    ax.set_ylabel("Ceres time / pyclad time (same solver)")
    ax.set_title("Bundle adjustment: speed-up against problem size")
    ax.legend(fontsize=8)
    save(fig, "ba_speedup_vs_size.png")


def convergence(plt):
    """Cost after each iteration against each solver's own clock, pyclad and Ceres in one run:
    the 2-core CPU's run and the H200 machine's, each its own table and plot."""
    for key, suffix in (("convergence_cpu", ""), ("convergence_gpu", "_gpu")):
        _convergence(plt, LATEST[key], suffix)


def _convergence(plt, name, suffix):
    data = load(name)
    runs = {}
    for r in data["rows"]:
        runs.setdefault(r["variant"], []).append(r)
    m = data["meta"]
    body = [[m["problem"], f"`{m['linear_solver']}`", m["pyclad_iterations"], m["ceres_iterations"],
             f"{m['pyclad_final_cost']:.6e}", f"{m['ceres_final_cost']:.6e}", m["pyclad_wall_s"],
             m["ceres_solve_wall_s"], f"**{m['ceres_solve_wall_s'] / m['pyclad_wall_s']:.2f}x**", link(name)]]
    table(f"convergence{suffix}.md", ["problem", "solver", "iterations (pyclad)", "iterations (Ceres)", "pyclad final cost",
                             "Ceres final cost", "pyclad solve s (wall clock)", "Ceres solve s (its own)",
                             "Ceres / pyclad", "source"], body, [name])
    # Left: the cost. Right: how far above the lower of the two final costs it still is, which
    # shows the tail that the left panel's scale flattens (points at or below it are left out).
    floor = min(m["pyclad_final_cost"], m["ceres_final_cost"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for variant, label in (("pyclad", f"pyclad ({m['device']})"), ("ceres", f"Ceres, {m['ceres_threads']} threads")):
        pts = runs.get(variant, [])
        axes[0].plot([r["cumulative_s"] for r in pts], [r["cost"] for r in pts], marker="o", ms=3, label=label)
        above = [(r["cumulative_s"], (r["cost"] - floor) / floor) for r in pts if r["cost"] > floor]
        if above:
            axes[1].plot(*zip(*above), marker="o", ms=3, label=label)
    for ax, ylabel in ((axes[0], "cost"), (axes[1], "(cost - lower final cost) / lower final cost")):
        ax.set_yscale("log")
        ax.set_xlabel("seconds since the solve began (each solver's own clock)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
    axes[0].set_title(f"{m['problem']}, {m['linear_solver']}")
    axes[1].set_title("distance to the final cost")
    save(fig, f"convergence{suffix}.png")


def multi_device():
    names = ["bench_multi_device-pocl-full", "bench_multi_device-mpi-pocl-full", "bench_multi_device-nvidia-full",
             "bench_multi_device-mpi-nvidia-full", "bench_multi_device-nvidia-4x"]
    body = [[r["case"], r["variant"], r["median_s"], r.get("x_one_part", "-"),
             f"{r['bytes_per_iteration'] / 1e6:.2f} MB" if r.get("bytes_per_iteration") else "-",
             f"{r['cost_vs_one_part']:.0e}" if r.get("cost_vs_one_part") else "0", link(n)]
            for n in names for r in load(n)["rows"]]
    table("multi_device.md", ["problem, solver", "run", "s per iteration", "x one part", "bytes per iteration",
                              "final cost vs one part", "source"], body, names)


# ----------------------------------------------------------------------------- COLMAP


def _tagged(key):
    """Rows of a result file, each remembering the file (for the tables' source column)."""
    name = LATEST[key]
    found = kv_log(name) if name.endswith(".log") else rows(name)
    return [dict(r, source=name) for r in found]


def _colmap_kind(row):
    """The kind of reconstruction a bench_colmap case names (its layout words overlap: a fisheye
    case has a camera per image too)."""
    case = row["case"]
    for kind in ("OPENCV_FISHEYE", "rig of 2", "rig of 6", "pose priors", "shared camera"):
        if kind in case:
            return kind
    return "camera per image"


def colmap(plt):
    cpu = _tagged("colmap_cpu") + _tagged("colmap_cpu_2000")
    body = [[r["case"], f"{r['observations']:,}", r["pycolmap_solver"], f"`{r['variant']}`", r["ours_s"],
             r["pycolmap_s"], f"**{r['time_ratio']:.2f}**", f"{r['ours_iterations']}/{r['pycolmap_iterations']}",
             f"{r['cost_ratio']:.6f}", link(r["source"])] for r in cpu]
    extra = _tagged("colmap_cpu_rigs") + _tagged("colmap_cpu_priors")
    body += [[r["case"], f"{r['observations']:,}", r["pycolmap_solver"], f"`{r['variant']}`", r["ours_s"],
              r["pycolmap_s"], f"**{r['time_ratio']:.2f}**", f"{r['ours_iterations']}/{r['pycolmap_iterations']}",
              f"{r['cost_ratio']:.6f}", link(r["source"])] for r in extra]
    table("colmap_cpu.md", ["reconstruction", "observations", "pycolmap's solver", "ours", "ours s", "pycolmap s",
                            "ours / pycolmap", "iterations (ours/pycolmap)", "final cost ratio", "source"],
          body, [LATEST[k] for k in ("colmap_cpu", "colmap_cpu_2000", "colmap_cpu_rigs", "colmap_cpu_priors")])

    gpu = (_tagged("colmap_gpu") + _tagged("colmap_gpu_2000") + _tagged("colmap_gpu_rigs")
           + _tagged("colmap_gpu_priors") + _tagged("colmap_gpu_fisheye"))
    body = [[r["case"], f"{int(r['observations']):,}", r["pycolmap_solver"], r["ours_s"], r["pycolmap_s"],
             f"**{r['pycolmap_s'] / r['ours_s']:.1f}x**", f"{int(r['ours_iterations'])}/{int(r['pycolmap_iterations'])}",
             f"{r['cost_ratio']:.6f}", link(r["source"])] for r in gpu]
    table("colmap_gpu.md", ["reconstruction", "observations", "pycolmap's solver", "ours s", "pycolmap s",
                            "pycolmap / ours", "iterations (ours/pycolmap)", "final cost ratio", "source"],
          body, [LATEST[k] for k in ("colmap_gpu", "colmap_gpu_2000", "colmap_gpu_rigs", "colmap_gpu_priors",
                                     "colmap_gpu_fisheye")])

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, rs, title in ((axes[0], cpu, "2-core CPU (PoCL), pycolmap on 2 threads"),
                          (axes[1], gpu[:7], "H200, pycolmap on 16 cores")):
        labels = [r["case"].replace(" images", " img").replace("camera per image", "cam/img") for r in rs]
        bars(ax, labels, {"pyclad": [r["ours_s"] for r in rs], "pycolmap": [r["pycolmap_s"] for r in rs]},
             "seconds per solve")
        ax.set_title(title)
    save(fig, "colmap_time_per_reconstruction.png")

    fig, ax = plt.subplots(figsize=(7, 4))
    kinds = ("shared camera", "camera per image", "rig of 2", "rig of 6", "pose priors", "OPENCV_FISHEYE")
    # A colour per kind of reconstruction, a line style per machine.
    for rs, label, marker, ls in ((cpu + extra, "2-core CPU", "o", "-"), (gpu, "H200", "s", "--")):
        for i, kind in enumerate(kinds):
            pts = sorted((r["observations"], r["pycolmap_s"] / r["ours_s"]) for r in rs if _colmap_kind(r) == kind)
            if pts:
                ax.plot(*zip(*pts), marker=marker, ls=ls, color=f"C{i}", label=f"{label}, {kind}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log_ticks(ax.yaxis)
    ax.axhline(1, color="k", lw=0.8)
    ax.set_xlabel("observations")
    ax.set_ylabel("pycolmap time / pyclad time")
    ax.set_title("COLMAP bundle adjustment: speed-up against size")
    ax.legend(fontsize=7, ncol=2)
    save(fig, "colmap_speedup_vs_size.png")


# ----------------------------------------------------------------------------- vision ops


def dcnv4_table(name, result):
    """The as-called table of a DCNv4 run (ours and the official operator's) into ``name``."""
    d_all = rows(result, section="as called")
    table(name, ["shape (N, H, W, C), G=4", "pass", "dtype", "ours as called ms", "official as called ms",
                 "ratio", "ours pipelined ms", "official pipelined ms", "our kernel ms", "official kernel ms"],
          [[r["case"], r["variant"], r["dtype"], r["ours_as_called_ms"], r.get("official_as_called_ms"),
            f"**{r['as_called_ratio']:.2f}x**" if r.get("as_called_ratio") else "no official op",
            r.get("ours_pipelined_ms"), r.get("official_pipelined_ms"), r["ours_kernel_ms"],
            r.get("official_events_ms")] for r in d_all], [result])
    return d_all


def vision(plt):
    d_all = dcnv4_table("dcnv4.md", LATEST["dcnv4"])
    d = [r for r in d_all if r.get("as_called_ratio")]      # the rows with an official op to compare
    a = rows(LATEST["aggregation"], section="as called")
    table("aggregation.md", ["case", "pass", "ours as called ms", "CUDA op as called ms", "ratio",
                             "our kernels ms", "CUDA op kernels ms"],
          [[r["case"], r["variant"], r["ours_as_called_ms"], r["official_as_called_ms"],
            f"**{r['as_called_ratio']:.1f}x**", r["ours_kernel_ms"], r["official_events_ms"]] for r in a],
          [LATEST["aggregation"]])
    t = load(LATEST["torch"])["rows"]
    steps = [(o, u) for o in t if o["variant"].startswith("official") for u in t
             if u["case"] == o["case"] and u["variant"].startswith("ours")]
    table("torch.md", ["training step (forward, loss, backward)", "ours ms", "official op ms", "ours faster by"],
          [[o["case"], u["median_s"] * 1e3, o["median_s"] * 1e3, f"**{o['median_s'] / u['median_s']:.2f}x**"]
           for o, u in steps], [LATEST["torch"]])

    w = load(LATEST["warp_gpu"])["rows"]
    body = []
    for case in dict.fromkeys(r["case"] for r in w):
        by = {r["variant"]: r for r in w if r["case"] == case}
        cv = by["opencv warpAffine+blobFromImages"]["median_s"]
        body.append(["H200 (OpenCV on 16 cores)", case, cv * 1e3,
                     by["kernel, 2 px/work-item (default)"]["median_s"] * 1e3,
                     by["end-to-end numpy -> new numpy"]["median_s"] * 1e3,
                     by["end-to-end numpy -> out= numpy"]["median_s"] * 1e3,
                     f"**{cv / by['end-to-end numpy -> new numpy']['median_s']:.2f}x**", link(LATEST["warp_gpu"])])
    for name in LATEST["warp_cpu"]:
        by = {r["variant"]: r for r in md_rows(name)}
        cv = by["opencv warpAffine+blobFromImages"]["ms"]
        body.append([f"2-core Zen 5, PoCL ({name.split('-')[-1][:-3]})", by["opencv warpAffine+blobFromImages"]["case"],
                     cv, by["kernel, 16 px/work-item (default)"]["ms"], by["end-to-end numpy -> new numpy"]["ms"],
                     by["end-to-end numpy -> out= numpy"]["ms"],
                     f"**{cv / by['end-to-end numpy -> new numpy']['ms']:.2f}x**", link(name)])
    table("warp_affine.md", ["machine", "case", "OpenCV ms", "kernel ms", "end-to-end ms", "end-to-end, `out=` ms",
                             "OpenCV / end-to-end", "source"], body, [LATEST["warp_gpu"]] + LATEST["warp_cpu"])

    o = _tagged("overhead_gpu") + _tagged("overhead_cpu")
    table("overhead.md", ["machine", "case", "op", "host us per call", "over a raw launch us", "within 50 us",
                          "source"],
          [["H200" if r["source"] == LATEST["overhead_gpu"] else "2-core Zen 5", r["case"], f"`{r['variant']}`",
            r["host_us"], r["over_raw_us"], r["within_50us"], link(r["source"])] for r in o],
          [LATEST["overhead_gpu"], LATEST["overhead_cpu"]])

    fig, ax = plt.subplots(figsize=(9, 8))
    short = {"forward": "fwd", "backward, deterministic": "bwd", "backward, float atomics": "bwd atomics"}
    labels = [f"DCNv4 {short.get(r['variant'], r['variant'])} {r['case'].split(' G=')[0]} {r['dtype']}" for r in d]
    labels += [f"aggregation {r['case'].split()[0]} {r['variant']}" for r in a]
    labels += [o["case"].split(" (")[0] + " step" for o, _ in steps]
    ratios = [r["as_called_ratio"] for r in d] + [r["as_called_ratio"] for r in a]
    ratios += [o["median_s"] / u["median_s"] for o, u in steps]
    colors = ["C0"] * len(d) + ["C1"] * len(a) + ["C2"] * len(steps)
    ax.barh(range(len(labels)), ratios, color=colors)
    for y, v in enumerate(ratios):
        ax.text(v * 1.03, y, f"{v:.2f}x", va="center", fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(min(0.8, min(ratios) * 0.8), max(ratios) * 1.6)   # room for the slowest bar and the labels
    _plain_log_ticks(ax.xaxis)
    ax.axvline(1, color="k", lw=0.8)
    machines = sorted({rf.gpu(n) for n in (LATEST["dcnv4"], LATEST["aggregation"], LATEST["torch"])})
    where = f"on the {machines[0]}" if len(machines) == 1 else \
        f"DCNv4 on the {rf.gpu(LATEST['dcnv4'])}, the others on the {rf.gpu(LATEST['aggregation'])}"
    ax.set_xlabel(f"CUDA original's time / pyclad's time, as called (> 1: pyclad faster)\n{where}")
    ax.set_title("Vision ops against the CUDA originals")
    save(fig, "vision_vs_cuda.png")


# ----------------------------------------------------------------------------- AD


def ad(plt):
    j = load(LATEST["jacobian_cpu"])["rows"]
    cases = list(dict.fromkeys(r["case"] for r in j))
    want = ["ceres autodiff 2 threads", "ceres solver jacobian evaluation 2 threads", "pyclad codegen float64 kernel",
            "pyclad codegen float64 host", "pyclad tape float64 host", "pyclad tape float32 host"]
    by = {(r["case"], r["variant"]): r for r in j}
    body = [[c, f"{int(by[(c, want[0])]['items']):,}"] + [f"{by[(c, v)]['items_per_s'] / 1e6:.1f} M" if (c, v) in by
                                                            else "-" for v in want] for c in cases]
    table("jacobian_cpu.md", ["problem", "observations"] + [v.replace(" 2 threads", "") for v in want], body,
          [LATEST["jacobian_cpu"]])
    d16 = load(LATEST["jacobian_cpu_d16"])["rows"]
    table("jacobian_cpu_d16.md", ["problem", "variant", "observations per s", "x Ceres' in-solver evaluation"],
          [[r["case"], r["variant"], f"{r['items_per_s'] / 1e6:.1f} M", r.get("x_ceres_solver", "-")] for r in d16],
          [LATEST["jacobian_cpu_d16"]])
    g = load(LATEST["jacobian_gpu"])["rows"]
    gw = ["ceres autodiff 16 threads", "pyclad codegen float64 kernel", "pyclad codegen float32 kernel",
          "pyclad tape float64 kernel", "pyclad codegen float64 host"]
    gby = {(r["case"], r["variant"]): r for r in g}
    gcases = list(dict.fromkeys(r["case"] for r in g))
    table("jacobian_gpu.md", ["problem"] + gw,
          [[c] + [f"{gby[(c, v)]['items_per_s'] / 1e6:,.0f} M" if (c, v) in gby else "-" for v in gw] for c in gcases],
          [LATEST["jacobian_gpu"]])
    for key, file in (("tape_cpu", "tape_cpu.md"), ("tape_gpu", "tape_gpu.md")):
        t = load(LATEST[key])["rows"]
        table(file, ["case", "rung", "tuples per s", "x codegen", "kernel ms"],
              [[r["case"], r["variant"], f"{r['items_per_s'] / 1e6:,.1f} M", r["x_codegen"], r["kernel_ms"]] for r in t],
              [LATEST[key]])
    c = load(LATEST["compile_cpu"])["rows"]
    table("compile_cpu.md", ["function", "variant", "build s", "nodes", "tuples per s"],
          [[r["case"], r["variant"], r["build_s"], r["nodes"], f"{r['tuples_per_s'] / 1e6:.2f} M"] for r in c],
          [LATEST["compile_cpu"]])

    fig, ax = plt.subplots(figsize=(9, 4))
    bars(ax, [c.replace("-pre", "") for c in cases],
         {v.replace(" 2 threads", ""): [by[(c, v)]["items_per_s"] if (c, v) in by else None for c in cases]
          for v in want}, "observations per second")
    ax.set_title("Snavely residuals + Jacobians, 2-core CPU (PoCL) against Ceres on 2 threads")
    save(fig, "ad_throughput_cpu.png")


# ----------------------------------------------------------------------------- cold start


def cold_start(plt):
    for key, file in (("cold_gpu", "cold_start.md"), ("cold_cpu", "cold_start_cpu.md")):
        rows_ = load(LATEST[key])["rows"]
        table(file, ["case", "variant", "whole process s (median)", "x peer", "input"],
              [[x["case"], x["variant"], x["median_s"], x.get("ratio_to_peer", "-"), x.get("input", "")]
               for x in rows_ if "phases" not in x], [LATEST[key]])
        phased = [x for x in rows_ if "phases" in x]
        if phased:          # (--phases runs: one more warm process each, its parts' times)
            table(file.replace(".md", "_phases.md"), ["case", "seconds from the process' start"],
                  [[x["case"], x["phases"]] for x in phased], [LATEST[key]])
    r = load(LATEST["cold_gpu"])["rows"]
    cases = [c for c in dict.fromkeys(x["case"] for x in r) if c != "import"]
    by = {(x["case"], x["variant"]): x["median_s"] for x in r}
    peer = lambda c: next((v for (cc, k), v in by.items() if cc == c and k.startswith("peer")), None)
    fig, ax = plt.subplots(figsize=(9, 4))
    bars(ax, [c.replace(", camera per image", "") for c in cases],
         {"pyclad cold (empty caches)": [by.get((c, "ours cold")) for c in cases],
          "pyclad warm": [by.get((c, "ours warm")) for c in cases],
          "peer (Ceres / pycolmap process)": [peer(c) for c in cases]}, "seconds, whole process", log=False)
    ax.set_title("Whole command-line processes on the H200 machine")
    save(fig, "cold_start.png")


# ----------------------------------------------------------------------------- headline


def _span(values, digits=2, unit="x"):
    lo, hi = min(values), max(values)
    return f"{lo:.{digits}f}-{hi:.{digits}f}{unit}"


def headline():
    """The overview's table: a range per area, each computed here from its result files."""
    gpu = _ba_cases(LATEST["ba_gpu_bal"])
    best = lambda v, who: min(r["median_s"] for k, r in v.items() if k.startswith(who))
    bal = [best(v, "ceres") / best(v, "pyclad") for v in gpu.values()]
    venice = [best(v, "ceres") / best(v, "pyclad") for v in _ba_cases(LATEST["ba_gpu_venice_sparse"]).values()]
    venice_now = [best(v, "ceres") / best(v, "pyclad") for v in _ba_cases(LATEST["ba_gpu_venice_h100"]).values()]
    cpu = _ba_cases(LATEST["ba_cpu"])
    cpu_ratio = {s: [v[f"pyclad-{s}"]["median_s"] / v[f"ceres-{s}"]["median_s"] for v in cpu.values()]
                 for s in ("sparse_schur", "iterative_schur")}
    colmap_gpu = rows(LATEST["colmap_gpu"]) + rows(LATEST["colmap_gpu_2000"])
    colmap_cpu = rows(LATEST["colmap_cpu"]) + rows(LATEST["colmap_cpu_2000"])
    d = {v: [r["as_called_ratio"] for r in rows(LATEST["dcnv4"], section="as called", variant=v)
             if r.get("as_called_ratio")] for v in ("forward", "backward, deterministic", "backward, float atomics")}
    a = {p: [r["as_called_ratio"] for r in rows(LATEST["aggregation"], section="as called", variant=p)]
         for p in ("forward", "backward")}
    cold = {(r["case"], r["variant"]): r["median_s"] for r in load(LATEST["cold_gpu"])["rows"]}
    bal49 = "BAL problem-49-7776-pre.txt.bz2"
    colmap200 = "COLMAP 200 images, camera per image, 96000 observations"
    body = [
        ["bundle adjustment, five BAL problems, H200", f"{_span(bal, 1)} faster than Ceres' faster solver on 16 "
         f"cores; venice size (5.04M observations) {venice[0]:.1f}x, and {venice_now[0]:.1f}x with the current "
         f"dense solves on an {rf.gpu(LATEST['ba_gpu_venice_h100'])} (Ceres' time differs between the machines)",
         "[Bundle adjustment](bundle-adjustment.md)",
         ", ".join(link(LATEST[k]) for k in ("ba_gpu_bal", "ba_gpu_venice_sparse", "ba_gpu_venice_h100"))],
        ["bundle adjustment, 2-core CPU (PoCL)", f"{_span(cpu_ratio['iterative_schur'])} Ceres' time with "
         f"`iterative_schur`, {_span(cpu_ratio['sparse_schur'])} with `sparse_schur`, same final costs",
         "[Bundle adjustment](bundle-adjustment.md)", link(LATEST["ba_cpu"])],
        ["COLMAP, H200", f"{_span([r['pycolmap_s'] / r['ours_s'] for r in colmap_gpu], 1)} faster than pycolmap "
         f"on 16 cores, 48,000-960,000 observations", "[COLMAP](colmap.md)",
         link(LATEST["colmap_gpu"]) + ", " + link(LATEST["colmap_gpu_2000"])],
        ["COLMAP, 2-core CPU (PoCL)", f"{_span([r['time_ratio'] for r in colmap_cpu])} pycolmap's time, 30-2,000 "
         f"images", "[COLMAP](colmap.md)", link(LATEST["colmap_cpu"]) + ", " + link(LATEST["colmap_cpu_2000"])],
        [f"DCNv4, {rf.gpu(LATEST['dcnv4'])}, as called", f"forward {_span(d['forward'])} the official CUDA operator's speed; "
         f"backward {_span(d['backward, deterministic'])} (deterministic, the default), "
         f"{_span(d['backward, float atomics'])} with float atomics",
         "[Vision ops](vision-ops.md)", link(LATEST["dcnv4"])],
        ["deformable aggregation, H200, as called", f"forward {_span(a['forward'], 1)}, backward "
         f"{_span(a['backward'], 1)} faster than Sparse4D's CUDA operator", "[Vision ops](vision-ops.md)",
         link(LATEST["aggregation"])],
        ["cold start, H200", f"`python -m solvers.bal` on problem-49: {cold[(bal49, 'ours cold')]:.2f} s from empty "
         f"caches, {cold[(bal49, 'ours warm')]:.2f} s warm, "
         f"{cold[(bal49, 'ours warm')] / cold[(bal49, 'peer (Ceres)')]:.2f}x the time of Ceres' process "
         f"({cold[(bal49, 'peer (Ceres)')]:.2f} s in the same run); COLMAP, 200 images, warm: "
         f"{cold[(colmap200, 'ours warm')] / cold[(colmap200, 'peer (pycolmap)')]:.2f}x the time of "
         f"pycolmap's process", "[Cold start](cold-start.md)", link(LATEST["cold_gpu"])],
    ]
    lines = ["| area | figure | page | source |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    rf.write_text(os.path.join(rf.TABLES, "headline.md"), "\n".join(lines) + "\n")
    # The README's copy: the same rows, the page linked from the top of the checkout (the README
    # cannot include a snippet; readme_table() puts this between its markers).
    lines = ["| area | figure | details |", "|---|---|---|"]
    lines += [f"| {area} | {figure} | " + re.sub(r"\[(.*?)\]\(([\w-]+\.md)\)",
                                                  lambda m: f"[{m[1]}](docs/performance/{m[2]})", page) + " |"
              for area, figure, page, _ in body]
    rf.write_text(os.path.join(rf.TABLES, README_TABLE), "\n".join(lines) + "\n")


README_TABLE = "readme_headline.md"
README_MARKERS = ("<!-- headline table: written by benchmarks/plots.py -->", "<!-- end of headline table -->")


def readme_table(readme=os.path.join(rf.ROOT, "README.md")):
    """Put the headline table (headline()'s README copy) between the README's markers."""
    with open(os.path.join(rf.TABLES, README_TABLE)) as f:
        table = f.read()
    with open(readme) as f:
        text = f.read()
    start, end = (text.index(m) for m in README_MARKERS)
    rf.write_text(readme, text[:start + len(README_MARKERS[0])] + "\n\n" + table + "\n" + text[end:])


class _NoPlots:
    """Stands in for pyplot with --no-plots: the tables are written, every drawing call is a no-op."""

    def subplots(self, *args, **kwargs):
        n = args[1] if len(args) > 1 else 1
        return self, [self] * n if n > 1 else self

    def __getattr__(self, name):
        return lambda *args, **kwargs: self

    def __iter__(self):
        return iter(())


def main(argv=None):
    global PLOTS, DRAW
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tables", default=rf.TABLES, help="folder for the Markdown tables (default docs/snippets/perf)")
    ap.add_argument("--plots", default=PLOTS, help="folder for the PNG plots (default docs/assets/plots)")
    ap.add_argument("--no-plots", action="store_true", help="write the tables only (no matplotlib needed)")
    ap.add_argument("--no-readme", dest="readme", action="store_false",
                    help="leave README.md's headline table as it is")
    args = ap.parse_args(argv)
    rf.TABLES, PLOTS, DRAW = args.tables, args.plots, not args.no_plots
    plt = _NoPlots() if args.no_plots else _plt()
    for part in (bundle_adjustment, convergence, colmap, vision, ad, cold_start):
        part(plt)
    multi_device()
    headline()
    if args.readme:
        readme_table()
    return 0


if __name__ == "__main__":
    sys.exit(main())
