"""Whole processes, as a user starts them, with the caches cold and warm, beside the peers' whole
processes: wall clock around ``subprocess.run``, median of ``--repeat`` runs.

    python benchmarks/bench_cold_start.py [--device SPEC] [--repeat 3] [--threads N] [--quick]
                                          [--cases bal,readme,colmap,import] [--bal PATH]

Cases:
- ``bal``: ``python -m solvers.bal problem-49-7776-pre.txt.bz2 -q`` (Ceres' options spelled out:
  sparse_schur, 50 iterations, tolerances 1e-6/1e-10/1e-8, no loss) against the Ceres peer's
  ``ceres_bundle_adjuster`` process (benchmarks/ceres_peer.py, ``--threads``). Ours reads the .bz2
  and decompresses it in its own process (counted); the peer is given a decompressed .txt, made
  before its timed process (not counted; the ``input`` column and ``bz2_decompress_s`` say so).
- ``readme``: the README's first command, ``python -m solvers.bal`` (the synthetic problem).
- ``colmap``: ``python -m solvers.colmap MODEL --out OUT -q`` on pycolmap synthetic models of 200 and
  240 images (``--quick``: 200), a camera per image (bench_colmap.reconstruction, written once,
  untimed), against ``benchmarks/pycolmap_peer.py MODEL --out OUT`` (COLMAP's own adjuster: focal and
  extra parameters refined, principal point fixed, same gauge, tolerances, 50 iterations, ``--threads``).
- ``import``: ``python -c "import solvers, clkernels, pyclad"`` in a fresh interpreter, beside
  ``python -c pass``.

Cold: every run gets fresh, empty cache folders through the variables that name them:
``PYCLAD_CACHE_DIR`` (pyclad's program binaries), ``XDG_CACHE_HOME`` (pyopencl's and pytools'
caches, and pyclad's default), ``POCL_CACHE_DIR`` (PoCL's kernel cache) and ``CUDA_CACHE_PATH``
(NVIDIA's ComputeCache). The user's own caches (~/.cache/*, ~/.nv, a CUDA_CACHE_PATH already set)
are neither read nor touched (this script's own process gets throwaway ones too). Warm:
``--repeat`` runs right after a cold run, in its folders.
``caches_after_cold`` lists what the first cold run left in each. ``--phases``: one more warm process
of each of ours through ``cli_phases.py`` (the ``phases`` column: when its imports, the driver's
start in its thread, the reading, the solve and the writing began and ended, seconds from the
process' start; its wall clock is that one process'). Before anything is timed the
packages' bytecode is compiled (as an install does) and one untimed process imports them (so the
OS page cache does not count on the first case only); each peer gets ``--warmup`` untimed runs.
``iterations`` is Ceres' minimizer count (iteration 0 included) on every side.
Our runs' rows also hold the solver report's own ``Total`` and ``Preprocessor`` times (``setup_s``
where the report has a Setup line). A missing peer leaves a row saying why; the rest still runs.
The results are rewritten after every case (a killed run keeps the finished cases).

On the GPU machine (carry .device, .peers, .whl: 63 MiB):
    source .device/gpu-env.sh && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir
    --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH &&
    PYCLAD_CERES_PEERS=.peers python3 benchmarks/bench_cold_start.py --device nvidia
    --bal .device/bal/problem-49-7776-pre.txt.bz2 --out $OUT
To carry 29 MiB instead (.device, .devpack), pack the wheel's files and the bundle with xz here:
    mkdir -p .devpack && d=$(mktemp -d) && unzip -q .whl/pycolmap-4.2.1-*.whl -d $d &&
    tar -C $d -cf - . | xz -9e > .devpack/pycolmap-4.2.1-cp312.tar.xz &&
    tar -cf - .peers | xz -9 > .devpack/peers.tar.xz
and unpack them there (what pip --target would write, less its RECORD) before the command above:
    python3 -c "import tarfile; [tarfile.open(a).extractall(d, filter='tar') for a, d in
    (('.devpack/pycolmap-4.2.1-cp312.tar.xz', '/tmp/site'), ('.devpack/peers.tar.xz', '/tmp'))]"
    (then PYCLAD_CERES_PEERS=/tmp/.peers)
"""
import bz2
import compileall
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import harness  # noqa: E402
import ceres_peer  # noqa: E402

CACHE_VARS = {"PYCLAD_CACHE_DIR": "pyclad", "XDG_CACHE_HOME": "xdg", "POCL_CACHE_DIR": "pocl",
              "CUDA_CACHE_PATH": "nv"}
DRIVER_CACHE_VARS = ("POCL_CACHE_DIR", "CUDA_CACHE_PATH")     # the drivers' own caches among them
PACKAGES = ("solvers", "clkernels", "pyclad", "pyopencl", "pytools", "mako", "platformdirs", "pycolmap")
TOLERANCES = ["--function-tolerance", "1e-06", "--gradient-tolerance", "1e-10", "--parameter-tolerance", "1e-08"]
BAL_NAME = "problem-49-7776-pre.txt.bz2"


class Caches:
    """One set of fresh cache folders, named to the processes through their variables."""

    def __init__(self, parent):
        self.root = tempfile.mkdtemp(prefix="caches-", dir=parent)
        self.dirs = {var: os.path.join(self.root, sub) for var, sub in CACHE_VARS.items()}
        for d in self.dirs.values():
            os.makedirs(d)

    def env(self, base):
        return {**base, **self.dirs}

    def renew(self, variables):
        """New, empty folders for ``variables`` (the others keep theirs)."""
        for var in variables:
            self.dirs[var] = tempfile.mkdtemp(prefix=CACHE_VARS[var] + "-", dir=self.root)

    def contents(self):
        """'pyclad 1.2 MB, xdg/pyopencl 3.4 MB, ...': what the processes left in each folder."""
        parts = []
        for var, d in self.dirs.items():
            subs = [os.path.join(d, s) for s in sorted(os.listdir(d))] if var == "XDG_CACHE_HOME" else [d]
            for s in subs:
                size = sum(os.path.getsize(os.path.join(w, f)) for w, _, fs in os.walk(s) for f in fs)
                parts.append(f"{os.path.relpath(s, self.root)} {size / 1e6:.2f} MB")
        return ", ".join(parts)

    def remove(self):
        shutil.rmtree(self.root, ignore_errors=True)


def run(argv, env, timeout=900):
    """(seconds, CompletedProcess): wall clock around the whole process."""
    t0 = time.perf_counter()
    p = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    return time.perf_counter() - t0, p


def parse_report(text):
    """The figures of our solver report (Ceres' Summary layout) that the rows carry."""
    fields = {"final_cost": r"^Final\s+(\S+)", "solver_total_s": r"^Total\s+(\S+)",
              "preprocessor_s": r"^Preprocessor\s+(\S+)", "setup_s": r"^\s*Setup\S*\s+(\S+)",
              "read_s": r"\(read in (\S+) s\)", "iterations": r"^Minimizer iterations\s+(\d+)"}
    out = {k: float(m.group(1)) for k, rx in fields.items() if (m := re.search(rx, text, re.M | re.I))}
    for key, rx in (("state", r"^Iterations run on\s+(\S+)"), ("termination", r"^Termination:\s+(\S+)")):
        if (m := re.search(rx, text, re.M)):
            out[key] = m.group(1)
    return out


def failed(what, p):
    tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["(no output)"]
    print(f"  !! {what} exited {p.returncode}:\n{(p.stderr or p.stdout)[-3000:]}", flush=True)
    return f"exit {p.returncode}: {tail[0][:200]}"


class Bench:
    def __init__(self, args, tmp):
        self.args, self.tmp = args, tmp
        self.base = dict(os.environ, PYTHONUNBUFFERED="1")
        if args.device:
            self.base["PYCLAD_DEVICE"] = args.device
        self.rep = harness.Report("bench_cold_start", args, threads=args.threads,
                                  cache_variables=",".join(CACHE_VARS), python=sys.executable)

    def peer(self, case, label, once, **extra):
        """``once()`` -> (seconds, figures) for one peer process; --warmup untimed, then --repeat."""
        for _ in range(self.args.warmup):
            once()
        runs = [once() for _ in range(self.args.repeat)]
        t = harness.Timing([s for s, _ in runs])
        self.rep.add(case, label, t, **{**runs[0][1], **extra})
        return t.median, runs[0][1].get("final_cost")

    def ours(self, case, argv, peer_s=None, peer_cost=None, fresh_out=None, **extra):
        """--repeat cold runs (fresh caches each), then --repeat warm runs in the last cold run's."""
        argv, caches = [sys.executable] + argv, None
        for variant in ("ours cold", "ours warm"):
            samples, figures = [], None
            for _ in range(self.args.repeat):
                if variant == "ours cold":
                    if caches:
                        caches.remove()
                    caches = Caches(self.tmp)
                if fresh_out:
                    shutil.rmtree(fresh_out, ignore_errors=True)
                s, p = run(argv, caches.env(self.base))
                if p.returncode != 0:
                    caches.remove()
                    self.rep.add(case, variant, error=failed(" ".join(argv[1:]), p), **extra)
                    return
                samples.append(s)
                if figures is None:
                    figures = parse_report(p.stdout)
                    if variant == "ours cold":
                        figures["caches_after_cold"] = caches.contents()
            t = harness.Timing(samples)
            row = dict(figures, **extra)
            if peer_s:
                row["ratio_to_peer"] = t.median / peer_s
            if peer_cost and "final_cost" in figures:
                row["cost_ratio"] = figures["final_cost"] / peer_cost
            self.rep.add(case, variant, t, **row)
        if self.args.phases:
            self.phases(case, argv, caches, fresh_out)
        caches.remove()

    def phases(self, case, argv, caches, fresh_out):
        """One more warm process through cli_phases.py: when its parts began and ended."""
        if fresh_out:
            shutil.rmtree(fresh_out, ignore_errors=True)
        out = os.path.join(self.tmp, "phases.json")
        env = caches.env(self.base)
        env["PYCLAD_PHASES_T0"] = repr(time.monotonic())
        p = subprocess.run([argv[0], os.path.join(HERE, "cli_phases.py"), out] + argv[1:], cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900)
        end = time.monotonic() - float(env["PYCLAD_PHASES_T0"])
        if p.returncode != 0:
            return self.rep.add(case, "ours warm, phases", error=failed("cli_phases.py", p))
        with open(out) as f:
            events = sorted(json.load(f), key=lambda e: e["start"])
        def short(e):           # a function by its own name; the interpreter's events as they are
            what = e["what"] if " " in e["what"] else e["what"].rsplit(".", 1)[-1]
            return what + (" (thread)" if e["thread"] != "MainThread" else "")
        text = "; ".join(f"{short(e)} {e['start']:.3f}-{e['end']:.3f}" for e in events if e["end"] > e["start"]
                         or e["what"].startswith(("interpreter up", "exit")))
        self.rep.add(case, "ours warm, phases", harness.Timing([end]), phases=f"{text}; process ended {end:.3f}")

    def missing(self, case, variant, why):
        print(f"  !! {case}: {variant} not run: {why}", flush=True)
        self.rep.add(case, variant, error=f"not run: {why}")

    # ------------------------------------------------------------------ cases

    def bal(self):
        path = self.args.bal or find_bal()
        if not path:
            return self.missing("bal", "all", f"{BAL_NAME} not found: pass --bal PATH or set PYCLAD_BAL_DIR")
        case, name = f"BAL {os.path.basename(path)}", os.path.basename(path)
        t0 = time.perf_counter()
        with bz2.open(path, "rb") if path.endswith(".bz2") else open(path, "rb") as f:
            f.read()
        decompress_s = time.perf_counter() - t0
        peer_s = peer_cost = None
        why = ceres_peer.unavailable_reason()
        if why:
            self.missing(case, "peer (Ceres)", why)
        else:
            def once():
                r = ceres_peer.bundle_adjust(path, "sparse_schur", threads=self.args.threads,
                                             **ceres_peer.REFERENCE_OPTIONS)
                return r["process_wall_s"], {
                    "final_cost": r["final_cost"], "solver_total_s": r["times"]["solve_wall_s"],
                    "iterations": r["iterations"]["minimizer_iterations"], "termination": r["termination"]["type"]}
            try:
                peer_s, peer_cost = self.peer(case, "peer (Ceres)", once, bz2_decompress_s=decompress_s,
                                              input=f"{name[:-4] if name.endswith('.bz2') else name} "
                                                    "(decompressed beforehand, untimed)")
            except ceres_peer.CeresPeerError as e:
                self.missing(case, "peer (Ceres)", str(e).splitlines()[0])
        self.ours(case, ["-m", "solvers.bal", path, "-q", "--linear-solver", "sparse_schur", "--iterations", "50"]
                  + TOLERANCES, peer_s, peer_cost, input=f"{name} (read by the process)")

    def readme(self):
        self.ours("README: python -m solvers.bal", ["-m", "solvers.bal"], input="synthetic 20,2000,4")

    def colmap(self):
        try:
            import bench_colmap    # pycolmap writes the models (and is the peer)
        except (ImportError, SystemExit) as e:
            return self.missing("colmap", "all", f"pycolmap is needed to write the models ({e})")
        sizes = [200] if self.args.quick else [int(v) for v in self.args.colmap_images.split(",")]
        for n in sizes:
            model, out = os.path.join(self.tmp, f"model-{n}"), os.path.join(self.tmp, f"out-{n}")
            os.makedirs(model)
            rec = bench_colmap.reconstruction(n, "per-image")
            rec.write(model)
            case = f"COLMAP {n} images, camera per image, {rec.compute_num_observations()} observations"
            form = "binary model folder, read and written back by the process"
            peer_argv = [sys.executable, os.path.join(HERE, "pycolmap_peer.py"), model, "--out", out,
                         "--threads", str(self.args.threads)]

            def once():
                shutil.rmtree(out, ignore_errors=True)
                s, p = run(peer_argv, self.base)
                if p.returncode != 0:
                    raise RuntimeError(failed("pycolmap_peer.py", p))
                r = json.loads(p.stdout)
                return s, {k: r[k] for k in ("final_cost", "iterations", "termination", "linear_solver")} | \
                    {"solver_total_s": r["ceres_total_s"]}
            try:
                peer_s, peer_cost = self.peer(case, "peer (pycolmap)", once, input=form)
            except RuntimeError as e:
                peer_s = peer_cost = None
                self.rep.add(case, "peer (pycolmap)", error=str(e))
            self.ours(case, ["-m", "solvers.colmap", model, "--out", out, "-q", "--linear-solver", "sparse_schur",
                             "--iterations", "50", "--refine-focal-length", "--no-refine-principal-point",
                             "--refine-extra-params"] + TOLERANCES, peer_s, peer_cost, fresh_out=out, input=form)
            shutil.rmtree(model, ignore_errors=True)

    def imports(self):
        for variant, code in (("ours", "import solvers, clkernels, pyclad"), ("interpreter alone", "pass")):
            samples = []
            for _ in range(self.args.repeat):
                caches = Caches(self.tmp)
                s, p = run([sys.executable, "-c", code], caches.env(self.base))
                caches.remove()
                if p.returncode != 0:
                    return self.rep.add("import", variant, error=failed(code, p))
                samples.append(s)
            self.rep.add("import", variant, harness.Timing(samples), input=f'python -c "{code}"')


def find_bal():
    try:
        found = [f for f in ceres_peer.bal_files() if os.path.basename(f).startswith(BAL_NAME[:-8])]
    except ceres_peer.CeresPeerError:
        found = []
    fallbacks = [os.path.join(d, BAL_NAME) for d in ("/work/shared/data/bal", os.path.join(ROOT, ".device", "bal"))]
    for f in found + fallbacks:
        if os.path.isfile(f):
            return f
    return None


# What the timed processes import, beyond PACKAGES: their modules' bytecode is compiled too.
IMPORTED = ("numpy", "scipy.sparse", "solvers.colmap.cli", "solvers.split.cli", "solvers.io.read_ahead")
_LIST_MODULES = ("import sys, importlib\n"
                 "for n in sys.argv[1:]:\n"
                 "    try: importlib.import_module(n)\n"
                 "    except ImportError: pass\n"
                 "print('\\n'.join(sorted({getattr(m, '__file__', None) or '' for m in list(sys.modules.values())})))")


def prepare(tmp, base):
    """Bytecode compiled (as an install does) and one untimed import, so the first timed process
    does not alone pay for compiling .py files or reading the libraries from disk.

    Every module the processes import gets its bytecode, third-party ones too: an environment
    whose packages were installed without it (``pip --no-compile``; numpy on the GPU machine
    here, 0.3 s of compiling in every process) would otherwise be timed, where a user's install
    has it. The peers' processes get the same modules compiled."""
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        for d in (spec.submodule_search_locations or []) if spec else []:
            compileall.compile_dir(d, quiet=1)
    names = [n for n in PACKAGES if importlib.util.find_spec(n)] + list(IMPORTED)
    caches = Caches(tmp)
    s, p = run([sys.executable, "-c", _LIST_MODULES] + names, caches.env(base))
    files = [f for f in p.stdout.splitlines() if f.endswith(".py")]
    missing = [f for f in files if not os.path.exists(importlib.util.cache_from_source(f))]
    compiled = sum(bool(compileall.compile_file(f, quiet=2)) for f in missing)
    caches.remove()
    print(f"# prepared: bytecode of {len(files)} imported modules ({len(missing)} lacked it, {compiled} compiled "
          f"now), untimed import of {', '.join(names)} ({s:.2f} s, exit {p.returncode})")
    return {"bytecode_compiled": f"{compiled} of {len(files)} modules' .py lacked bytecode"}


def main():
    p = harness.parser(__doc__)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="the peers' threads (default: every core)")
    p.add_argument("--cases", default="bal,readme,colmap,import", help="comma-separated: bal, readme, colmap, import")
    p.add_argument("--bal", help=f"the BAL file (default: {BAL_NAME} from ceres_peer.bal_files())")
    p.add_argument("--colmap-images", default="200,240", help="COLMAP model sizes in images (--quick: 200)")
    p.add_argument("--phases", action="store_true",
                   help="one more warm process of each of ours through cli_phases.py: when its parts ran")
    p.set_defaults(repeat=3, warmup=1)
    args = p.parse_args()
    cases = args.cases.split(",")
    unknown = set(cases) - {"bal", "readme", "colmap", "import"}
    if unknown:
        p.error(f"--cases: unknown {', '.join(sorted(unknown))}")
    with tempfile.TemporaryDirectory(prefix="bench_cold_start-") as tmp:
        os.environ.update(Caches(tmp).dirs)      # our own process leaves the user's caches alone too
        bench = Bench(args, tmp)
        bench.rep.meta.update(prepare(tmp, bench.base))
        columns = ["case", "variant", "input", "median_s", "spread", "runs", "ratio_to_peer", "final_cost",
                   "cost_ratio", "solver_total_s", "preprocessor_s", "setup_s", "read_s", "iterations", "state",
                   "termination", "linear_solver", "bz2_decompress_s", "caches_after_cold", "phases", "error"]
        for case in cases:
            {"bal": bench.bal, "readme": bench.readme, "colmap": bench.colmap, "import": bench.imports}[case]()
            bench.rep.write([c for c in columns if any(c in r for r in bench.rep.rows)])


if __name__ == "__main__":
    main()
