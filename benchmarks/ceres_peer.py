"""The Ceres Solver peer that pyclad's benchmarks measure against in the same run.

Two C++ programs in ``benchmarks/peers/`` (see its README) do the work; this module builds,
finds and runs them and returns their JSON output as dicts::

    import ceres_peer                       # from benchmarks/ (or: from benchmarks import ceres_peer)
    if ceres_peer.available():
        j = ceres_peer.jacobian("problem-16-22106-pre.txt.bz2", threads=2, repeat=10)
        j["autodiff"]["obs_per_s"], j["autodiff"]["checksum"]["cost"]
        s = ceres_peer.bundle_adjust("problem-16-22106-pre.txt.bz2", "sparse_schur", threads=2)
        s["initial_cost"], s["final_cost"], s["iterations"], s["termination"]["type"]

Where the programs come from, in this order:

1. ``$PYCLAD_CERES_PEERS`` names a folder made by ``benchmarks/peers/bundle_for_device.sh``
   (programs plus every shared library they load, glibc's loader included): used as is, nothing
   is compiled. This is how the peer runs on a machine without Ceres (the GPU machine).
2. Otherwise they are built with cmake into ``benchmarks/peers/build/`` (cached; rebuilt when a
   source is newer). Needs ``apt-get install libceres-dev cmake make g++``.
3. Otherwise, if a bundle exists at ``<repo>/.peers``, that one.

``.bz2`` BAL files are decompressed into a temporary file first (Python's bz2 module), so the
programs need no bzip2 on the machine.

Command line (``python benchmarks/ceres_peer.py -h``): ``build``, ``jacobian FILE``,
``bundle-adjust FILE``, ``throughput`` (the Jacobian peer on every BAL problem) and
``reference`` (writes tests/data/ceres_bal_reference.json).
"""
from __future__ import annotations

import argparse
import bz2
import contextlib
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, Iterator, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SOURCE_DIR = os.path.join(HERE, "peers")
BUILD_DIR = os.path.join(SOURCE_DIR, "build")
DEFAULT_BUNDLE = os.path.join(ROOT, ".peers")
PROGRAMS = ("ceres_jacobian", "ceres_bundle_adjuster")
LOADER = "ld-linux-x86-64.so.2"
INSTALL_HINT = "install Ceres and a C++ toolchain (Debian/Ubuntu: apt-get install libceres-dev cmake make g++)"

LINEAR_SOLVERS = ("sparse_schur", "iterative_schur", "dense_schur")
PRECONDITIONERS = ("schur_jacobi", "jacobi", "identity")
LOSSES = ("none", "huber", "cauchy", "soft_l1")

# The options tests/data/ceres_bal_reference.json was made with (Ceres' own defaults too).
REFERENCE_OPTIONS = dict(max_iterations=50, function_tolerance=1e-6, gradient_tolerance=1e-10,
                         parameter_tolerance=1e-8, loss="none", jacobi_scaling=True)


class CeresPeerError(RuntimeError):
    """The peer cannot be built or run; the message says what to do."""


# ---------------------------------------------------------------------------- locating

def _bundle_from_env() -> Optional[str]:
    value = os.environ.get("PYCLAD_CERES_PEERS")
    if not value:
        return None
    path = value if os.path.isabs(value) else os.path.join(os.getcwd(), value)
    if not os.path.isdir(path) and not os.path.isabs(value):
        path = os.path.join(ROOT, value)  # relative to the repository root, wherever we run from
    if not all(os.path.isfile(os.path.join(path, "bin", p)) for p in PROGRAMS):
        raise CeresPeerError(f"PYCLAD_CERES_PEERS={value}: {path} has no bin/{PROGRAMS[0]} and "
                             f"bin/{PROGRAMS[1]}; make it with benchmarks/peers/bundle_for_device.sh")
    return path


def _ceres_config() -> Optional[str]:
    """The folder holding CeresConfig.cmake, if a Ceres installation can be seen."""
    candidates = [os.environ.get("Ceres_DIR", "")]
    for prefix in os.environ.get("CMAKE_PREFIX_PATH", "").split(os.pathsep) + ["/usr/local", "/usr", "/opt/ceres"]:
        if prefix:
            candidates += glob.glob(os.path.join(prefix, "lib*", "cmake", "Ceres"))
            candidates += glob.glob(os.path.join(prefix, "lib", "*", "cmake", "Ceres"))
            candidates += glob.glob(os.path.join(prefix, "share", "Ceres"))
    for c in candidates:
        if c and os.path.isfile(os.path.join(c, "CeresConfig.cmake")):
            return c
    return None


def _built() -> bool:
    return all(os.access(os.path.join(BUILD_DIR, p), os.X_OK) for p in PROGRAMS)


def _bundle_ok(path: str) -> bool:
    return all(os.path.isfile(os.path.join(path, "bin", p)) for p in PROGRAMS)


def _missing_build_tools() -> List[str]:
    needs = (("cmake", shutil.which("cmake")), ("make", shutil.which("make")),
             ("a C++ compiler", shutil.which("c++") or shutil.which("g++")),
             ("Ceres (CeresConfig.cmake)", _ceres_config()))
    return [what for what, ok in needs if not ok]


def unavailable_reason() -> Optional[str]:
    """None when the peer can run here, else why not (and how to fix it)."""
    try:
        if _bundle_from_env():
            return None
    except CeresPeerError as e:
        return str(e)
    if _built() or _bundle_ok(DEFAULT_BUNDLE):
        return None
    missing = _missing_build_tools()
    if missing:
        return f"the Ceres peer needs {', '.join(missing)}: {INSTALL_HINT}"
    return None


def available() -> bool:
    """Whether the Ceres peer can run here (bundled, already built, or buildable)."""
    return unavailable_reason() is None


def _stale() -> bool:
    if not _built():
        return True
    sources = glob.glob(os.path.join(SOURCE_DIR, "*.cc")) + glob.glob(os.path.join(SOURCE_DIR, "*.h")) + \
        [os.path.join(SOURCE_DIR, "CMakeLists.txt")]
    newest = max(os.path.getmtime(s) for s in sources)
    return any(os.path.getmtime(os.path.join(BUILD_DIR, p)) < newest for p in PROGRAMS)


def build(force: bool = False) -> str:
    """The folder holding ``ceres_jacobian`` and ``ceres_bundle_adjuster``, building them first
    (cmake, then make -j2 into benchmarks/peers/build/) when needed or when ``force``.
    A bundle named by $PYCLAD_CERES_PEERS is returned as is (its ``bin/``)."""
    bundle = _bundle_from_env()
    if bundle:
        return os.path.join(bundle, "bin")
    if not force and not _stale():
        return BUILD_DIR
    missing = _missing_build_tools()
    if missing:
        if not force and _bundle_ok(DEFAULT_BUNDLE):
            return os.path.join(DEFAULT_BUNDLE, "bin")
        raise CeresPeerError(f"cannot build the Ceres peer without {', '.join(missing)}: {INSTALL_HINT}")
    steps = [["cmake", "-S", SOURCE_DIR, "-B", BUILD_DIR, "-DCMAKE_BUILD_TYPE=Release"],
             ["cmake", "--build", BUILD_DIR, "--parallel", "2"] + (["--clean-first"] if force else [])]
    for cmd in steps:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if p.returncode != 0:
            raise CeresPeerError(f"building the Ceres peer failed ({' '.join(cmd)}):\n{p.stdout[-4000:]}\n"
                                 f"If Ceres is missing: {INSTALL_HINT}")
    if not _built():
        raise CeresPeerError(f"the build finished but {BUILD_DIR} lacks {PROGRAMS}")
    return BUILD_DIR


def _command(program: str) -> Tuple[List[str], Dict[str, str]]:
    """argv prefix and environment that run ``program`` from a build or a bundle."""
    folder = build()
    env = dict(os.environ)
    bundle = os.path.dirname(folder) if os.path.basename(folder) == "bin" else None
    if bundle is None:
        return [os.path.join(folder, program)], env
    lib = os.path.join(bundle, "lib")
    loader = os.path.join(lib, LOADER)
    if os.path.isfile(loader):
        # The bundle's own glibc loader: the host's glibc version then does not matter, and
        # --library-path (unlike LD_LIBRARY_PATH) does not leak into child processes.
        return [loader, "--library-path", lib, os.path.join(folder, program)], env
    env["LD_LIBRARY_PATH"] = lib + (os.pathsep + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return [os.path.join(folder, program)], env


# ---------------------------------------------------------------------------- running

@contextlib.contextmanager
def _plain_bal(path: str) -> Iterator[str]:
    """``path`` itself, or a decompressed temporary copy of a .bz2 file."""
    if not os.path.isfile(path):
        raise CeresPeerError(f"bal_path: no such file {path}")
    if not path.endswith(".bz2"):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="ceres_peer_") as tmp:
        plain = os.path.join(tmp, os.path.basename(path)[:-4])
        with bz2.open(path, "rb") as src, open(plain, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        yield plain


def _run(program: str, bal_path: str, args: List[str], timeout: Optional[float]) -> dict:
    prefix, env = _command(program)
    with _plain_bal(bal_path) as plain:
        argv = prefix + [f"--input={plain}"] + args
        t0 = time.perf_counter()
        try:
            p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise CeresPeerError(f"{program} ran past timeout={timeout} s on {bal_path}") from e
        wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise CeresPeerError(f"{program} failed (exit {p.returncode}) on {bal_path}:\n{p.stderr[-4000:]}")
    try:
        result = json.loads(p.stdout)
    except ValueError as e:
        raise CeresPeerError(f"{program} printed no JSON object:\n{p.stdout[-2000:]}") from e
    result["input"] = bal_path
    result["command"] = " ".join([program, f"--input={os.path.basename(bal_path)}"] + args)
    result["process_wall_s"] = wall
    result["stderr"] = p.stderr
    return result


def jacobian(bal_path: str, threads: int = 1, repeat: int = 10, warmup: int = 2, mode: str = "both",
             timeout: Optional[float] = 600) -> dict:
    """Time Ceres' residual + Jacobian evaluation over every observation of a BAL problem.

    ``mode``: "autodiff" (AutoDiffCostFunction::Evaluate per observation over ``threads``
    std::threads), "problem" (ceres::Problem::Evaluate into a CRSMatrix, num_threads=threads)
    or "both". Returns the program's JSON: per mode median_s/q25_s/q75_s/min_s/samples_s,
    obs_per_s, ns_per_obs and a checksum (residual_sum, cost = ½Σr², abs_jacobian_sum, ...)."""
    if mode not in ("both", "autodiff", "problem"):
        raise ValueError(f"mode={mode!r}: expected 'both', 'autodiff' or 'problem'")
    for name, v, lo in (("threads", threads, 1), ("repeat", repeat, 1), ("warmup", warmup, 0)):
        if not isinstance(v, int) or v < lo:
            raise ValueError(f"{name}={v!r}: expected an integer >= {lo}")
    return _run("ceres_jacobian", bal_path,
                [f"--threads={threads}", f"--repeat={repeat}", f"--warmup={warmup}", f"--mode={mode}"], timeout)


def bundle_adjust(bal_path: str, linear_solver: str = "sparse_schur", threads: int = 1, max_iterations: int = 50,
                  loss: str = "none", loss_scale: float = 1.0, function_tolerance: float = 1e-6,
                  gradient_tolerance: float = 1e-10, parameter_tolerance: float = 1e-8,
                  jacobi_scaling: bool = True, preconditioner: str = "schur_jacobi",
                  final_parameters: Optional[str] = None, timeout: Optional[float] = 600) -> dict:
    """Solve a BAL problem with Ceres (Levenberg-Marquardt, automatic Schur ordering).

    ``linear_solver``: "sparse_schur", "iterative_schur" (with ``preconditioner``, default
    SCHUR_JACOBI) or "dense_schur"; ``loss``: "none", "huber", "cauchy", "soft_l1" (with
    ``loss_scale``). ``final_parameters``: a path to write the solved parameters to (BAL order,
    one per line). Returns the program's JSON: initial_cost, final_cost, iterations
    {successful, unsuccessful, minimizer_iterations, steps}, termination {type, message},
    times {solve_wall_s, jacobian_evaluation_s, linear_solver_s, residual_evaluation_s, ...},
    num_threads, history (per-iteration cost etc.), options; plus "full_report" (Ceres' FullReport)."""
    checks = (("linear_solver", linear_solver, LINEAR_SOLVERS), ("loss", loss, LOSSES),
              ("preconditioner", preconditioner, PRECONDITIONERS))
    for name, v, allowed in checks:
        if v not in allowed:
            raise ValueError(f"{name}={v!r}: expected one of {', '.join(allowed)}")
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads={threads!r}: expected an integer >= 1")
    if not isinstance(max_iterations, int) or max_iterations < 0:
        raise ValueError(f"max_iterations={max_iterations!r}: expected an integer >= 0")
    if loss != "none" and not loss_scale > 0:
        raise ValueError(f"loss_scale={loss_scale!r}: a robust loss needs a scale > 0")
    args = [f"--linear_solver={linear_solver}", f"--preconditioner={preconditioner}",
            f"--max_iterations={max_iterations}", f"--function_tolerance={function_tolerance!r}",
            f"--gradient_tolerance={gradient_tolerance!r}", f"--parameter_tolerance={parameter_tolerance!r}",
            f"--num_threads={threads}", f"--jacobi_scaling={'true' if jacobi_scaling else 'false'}",
            f"--loss={loss}", f"--loss_scale={loss_scale!r}"]
    if final_parameters:
        args.append(f"--final_parameters={os.path.abspath(final_parameters)}")
    result = _run("ceres_bundle_adjuster", bal_path, args, timeout)
    result["full_report"] = result.pop("stderr")
    return result


# ---------------------------------------------------------------------------- BAL data

def bal_dir() -> Optional[str]:
    """The folder of the shared BAL problems: $PYCLAD_BAL_DIR, <repo>/shared/data/bal or
    <repo>/../shared/data/bal."""
    for d in (os.environ.get("PYCLAD_BAL_DIR", ""), os.path.join(ROOT, "shared", "data", "bal"),
              os.path.join(os.path.dirname(ROOT), "shared", "data", "bal")):
        if d and glob.glob(os.path.join(d, "problem-*.txt*")):
            return d
    return None


def bal_files(folder: Optional[str] = None) -> List[str]:
    """Every BAL problem in ``folder`` (default: :func:`bal_dir`), smallest first."""
    folder = folder or bal_dir()
    if not folder:
        raise CeresPeerError("no BAL problems found: set PYCLAD_BAL_DIR to a folder of problem-*.txt[.bz2]")
    files = glob.glob(os.path.join(folder, "problem-*.txt")) + glob.glob(os.path.join(folder, "problem-*.txt.bz2"))
    return sorted(files, key=os.path.getsize)


def _readme_initial_costs(folder: str) -> Dict[str, str]:
    """problem name -> initial cost as printed in the data folder's README table."""
    path = os.path.join(folder, "README.md")
    if not os.path.isfile(path):
        return {}
    text = open(path).read()
    return dict(re.findall(r"^\|\s*(problem-[\w-]+?)\s*\|\s*([0-9.]+e[+-]\d+)\s*\|", text, re.M))


def _problem_name(path: str) -> str:
    return re.sub(r"\.txt(\.bz2)?$", "", os.path.basename(path))


# ---------------------------------------------------------------------------- command line

def _compact_json(value, indent: str = "") -> str:
    """Indented JSON with lists of numbers or booleans kept on one line (diff-friendly, short)."""
    if isinstance(value, dict):
        inner = indent + " "
        items = [f"{inner}{json.dumps(k)}: {_compact_json(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}" if items else "{}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        inner = indent + " "
        return "[\n" + ",\n".join(inner + _compact_json(v, inner) for v in value) + "\n" + indent + "]"
    return json.dumps(value)


def _reference(out: str, threads: int) -> dict:
    folder = bal_dir()
    readme = _readme_initial_costs(folder) if folder else {}
    doc = {
        "description": "Ceres Solver bundle adjustment of the shared BAL problems, solved as stored "
                       "(no normalisation or perturbation), Snavely camera model, no loss, Levenberg-"
                       "Marquardt, automatic Schur ordering. Reference figures for pyclad's solver tests. "
                       "Ceres counts iteration 0 (the initial evaluation) among its minimizer iterations "
                       "and successful steps; 'steps' is the number of trust-region steps after it. With "
                       "2 threads the floating-point summation order varies, so repeated runs differ in "
                       "the last digits (two runs agreed to better than 1e-8 relative in final cost); compare with a "
                       "tolerance.",
        "generated_by": f"python benchmarks/ceres_peer.py reference --threads {threads} --out "
                        f"{os.path.relpath(out, ROOT)}",
        "when": time.strftime("%Y-%m-%d"),
        "common_options": dict(REFERENCE_OPTIONS, num_threads=threads),
    }
    for solver in ("sparse_schur", "iterative_schur"):
        rows = {}
        for path in bal_files(folder):
            r = bundle_adjust(path, solver, threads=threads, **REFERENCE_OPTIONS)
            name = _problem_name(path)
            expected = readme.get(name)
            if expected is not None and f"{r['initial_cost']:.6e}" != expected:
                raise CeresPeerError(f"{name}: Ceres' initial cost {r['initial_cost']:.6e} differs from the data "
                                     f"README's {expected}")
            rows[name] = {
                "file": os.path.basename(path),
                "num_cameras": r["num_cameras"], "num_points": r["num_points"],
                "num_observations": r["num_observations"],
                "initial_cost": r["initial_cost"], "final_cost": r["final_cost"],
                "readme_initial_cost": expected,
                "iterations": r["iterations"], "termination": r["termination"],
                "cost_history": [h["cost"] for h in r["history"]],
                "step_is_successful": [h["step_is_successful"] for h in r["history"]],
                "ceres_version": r["ceres_version"], "ceres_build": r["ceres_build"],
                "options": r["options"], "command": r["command"],
                "solve_wall_s": r["times"]["solve_wall_s"],
            }
            print(f"{solver:16s} {name:22s} initial {r['initial_cost']:.6e} final {r['final_cost']:.6e} "
                  f"steps {r['iterations']['steps']:3d} {r['termination']['type']} "
                  f"({r['times']['solve_wall_s']:.2f} s)", flush=True)
        doc[solver] = rows
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        f.write(_compact_json(doc) + "\n")
    print(f"written: {out}")
    return doc


def _throughput(threads: int, repeat: int, warmup: int) -> List[dict]:
    rows = []
    print(f"# Ceres {threads}-thread residual + Jacobian evaluation (median of {repeat} after {warmup} warm-up)\n"
          "| problem | observations | autodiff ms (IQR) | autodiff Mobs/s | Problem::Evaluate ms (IQR) "
          "| Problem::Evaluate Mobs/s | cost (checksum) |\n|---|---:|---:|---:|---:|---:|---:|")
    for path in bal_files():
        r = jacobian(path, threads=threads, repeat=repeat, warmup=warmup)
        a, p = r["autodiff"], r["problem"]
        cells = []
        for t in (a, p):
            cells += [f"{t['median_s'] * 1e3:.2f} ({(t['q75_s'] - t['q25_s']) / t['median_s']:.0%})",
                      f"{t['obs_per_s'] / 1e6:.3f}"]
        print(f"| {_problem_name(path)} | {r['num_observations']} | " + " | ".join(cells) +
              f" | {a['checksum']['cost']:.6e} |", flush=True)
        r.pop("stderr", None)
        rows.append(r)
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build (or locate) the peer programs and print their folder")
    b.add_argument("--force", action="store_true")
    j = sub.add_parser("jacobian", help="time residual + Jacobian evaluation on one BAL file")
    j.add_argument("file")
    s = sub.add_parser("bundle-adjust", help="solve one BAL file")
    s.add_argument("file")
    s.add_argument("--linear-solver", default="sparse_schur", choices=LINEAR_SOLVERS)
    s.add_argument("--preconditioner", default="schur_jacobi", choices=PRECONDITIONERS)
    s.add_argument("--max-iterations", type=int, default=50)
    s.add_argument("--loss", default="none", choices=LOSSES)
    s.add_argument("--loss-scale", type=float, default=1.0)
    s.add_argument("--no-jacobi-scaling", action="store_true")
    t = sub.add_parser("throughput", help="the Jacobian peer on every BAL problem (Markdown table)")
    r = sub.add_parser("reference", help="write the solver reference JSON for the tests")
    r.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "ceres_bal_reference.json"))
    for p in (j, s, t, r):
        p.add_argument("--threads", type=int, default=2)
    for p in (j, t):
        p.add_argument("--repeat", type=int, default=10)
        p.add_argument("--warmup", type=int, default=2)
    t.add_argument("--json", help="also write the raw results here")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "build":
            print(build(force=a.force))
        elif a.cmd == "jacobian":
            res = jacobian(a.file, threads=a.threads, repeat=a.repeat, warmup=a.warmup)
            res.pop("stderr", None)
            print(json.dumps(res, indent=1))
        elif a.cmd == "bundle-adjust":
            res = bundle_adjust(a.file, a.linear_solver, threads=a.threads, max_iterations=a.max_iterations,
                                loss=a.loss, loss_scale=a.loss_scale, jacobi_scaling=not a.no_jacobi_scaling,
                                preconditioner=a.preconditioner)
            sys.stderr.write(res.pop("full_report"))
            print(json.dumps(res, indent=1))
        elif a.cmd == "throughput":
            rows = _throughput(a.threads, a.repeat, a.warmup)
            if a.json:
                with open(a.json, "w") as f:
                    json.dump(rows, f, indent=1)
        elif a.cmd == "reference":
            _reference(a.out, a.threads)
    except CeresPeerError as e:
        print(f"ceres_peer: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
