"""Where a command line's wall clock goes: runs ``python -m MODULE ARGS...`` in this process with
timers around a few public functions, and writes when each call began and ended, in which
thread, as seconds since the parent started the process.

    PYCLAD_PHASES_T0=<parent's time.monotonic() just before the start> \
        python benchmarks/cli_phases.py OUT.json -m solvers.colmap MODEL --out OUT -q

The parent (``bench_cold_start.py --phases``) sets ``PYCLAD_PHASES_T0`` right before it starts
the process and notes when the process ended, on the same clock (Linux's CLOCK_MONOTONIC is one
clock for every process). What is timed:

- ``interpreter up``: this script's first line (the interpreter and its site imports);
- ``imports``: the command's package and the modules it imports in its main (``PRE_IMPORTS``),
  imported before the command runs, so that their functions can be wrapped;
- calls of: the OpenCL driver's start without the GIL (``clkernels.opencl_nogil.start_drivers``,
  ``create_context``) and the build workers' start (``clkernels.templates.start_build_workers``),
  which run in the ``opencl-start`` thread; ``solvers.read_bal``, ``solvers.bundle_adjust``,
  ``solvers.solve``; ``solvers.colmap.io.read_model`` and ``write_model``,
  ``solvers.colmap.problem.problem_from_reconstruction``, ``point_error_requests`` and
  ``update_reconstruction``; ``clkernels.templates.prefetch`` (programs named to the build workers);
  ``solvers.io.cli_output.write_or_keep`` (an output's validation, writing and replacement);
- ``exit``: the last exit handler (the interpreter's teardown follows), or ``exit (os._exit)``
  where the command ends by ``os._exit`` (:func:`solvers.split.cli.exit_process`).

Only calls made through the module attribute are seen (the command lines call them so), and
only of modules the command imports. The timers cost microseconds; nothing else is changed.
"""
import atexit
import importlib
import json
import os
import runpy
import sys
import threading
import time

T0 = float(os.environ.get("PYCLAD_PHASES_T0", "nan"))


def now() -> float:
    return time.monotonic() - T0


EVENTS = [{"what": "interpreter up", "start": now(), "end": now(), "thread": "MainThread"}]

WRAPPED = [("clkernels.opencl_nogil", "start_drivers"), ("clkernels.opencl_nogil", "create_context"),
           ("clkernels.templates", "start_build_workers"), ("solvers", "read_bal"), ("solvers", "bundle_adjust"),
           ("solvers", "solve"), ("solvers.colmap.io", "read_model"), ("solvers.colmap.io", "write_model"),
           ("solvers.colmap.problem", "problem_from_reconstruction"),
           ("solvers.colmap.problem", "update_reconstruction"), ("solvers.colmap.problem", "point_error_requests"),
           ("clkernels.templates", "prefetch"), ("solvers.io.cli_output", "write_or_keep")]


# What a command imports inside its main (so that its functions can be wrapped beforehand).
PRE_IMPORTS = {"solvers.colmap": ("solvers.colmap.cli", "solvers.colmap.io", "solvers.colmap.problem",
                                  "clkernels.opencl_nogil"),
               "solvers.bal": ("clkernels.opencl_nogil",)}


def timed(name, fn):
    def wrapper(*args, **kwargs):
        event = {"what": name, "start": now(), "thread": threading.current_thread().name}
        try:
            return fn(*args, **kwargs)
        finally:
            event["end"] = now()
            EVENTS.append(event)
    return wrapper


def main():
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        raise SystemExit("usage: cli_phases.py OUT.json -m MODULE [ARGS...]")
    out, module, args = sys.argv[1], sys.argv[3], sys.argv[4:]

    def write(how="exit"):
        if EVENTS[-1]["what"].startswith("exit"):
            return                      # written already
        EVENTS.append({"what": how, "start": now(), "end": now(), "thread": "MainThread"})
        with open(out, "w") as f:
            json.dump(EVENTS, f)
    atexit.register(write)      # registered first: it runs last
    real_exit = os._exit

    def exit_after_writing(code):   # the command lines end by os._exit (solvers.split.cli.exit_process)
        write("exit (os._exit)")
        real_exit(code)
    os._exit = exit_after_writing
    start = now()
    package = module.rsplit(".", 1)[0] if module.endswith(".__main__") else module
    for name in (package, "solvers.split.cli", "solvers.io.cli_output", *PRE_IMPORTS.get(package, ())):
        importlib.import_module(name)
    for mod, attr in WRAPPED:
        m = sys.modules.get(mod)        # (only what the command itself imports)
        if m is not None:
            setattr(m, attr, timed(f"{mod}.{attr}", getattr(m, attr)))
    EVENTS.append({"what": "imports", "start": start, "end": now(), "thread": "MainThread"})
    sys.argv = [module] + args
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
