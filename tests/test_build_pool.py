"""Builds in worker processes (clkernels.build_pool, templates.prefetch), with real processes on
every real OpenCL device and a fresh ``PYCLAD_CACHE_DIR`` per test.

The counts come from two places that cannot agree by accident: the caller's own
``cache.stats()``/``cache.made()`` (what it built or loaded) and ``PYCLAD_BUILD_LOG``, which every
process that builds from source appends to, the workers included.
"""
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

import clkernels
from clkernels import build_pool, templates
from clkernels.runtime import DeviceInfo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_REAL = [d for d in clkernels.list_devices() if not DeviceInfo.of(d).is_simulator]


@pytest.fixture(params=_REAL, ids=[DeviceInfo.of(d).name.split()[0] for d in _REAL])
def real_device(request):
    return request.param


def _spec(device):
    return f"{device.platform.name.strip()}:{DeviceInfo.of(device).name}"


def _env(tmp_path, **extra):
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYCLAD_CACHE_DIR=str(tmp_path / "cache"), PYCLAD_BUILD_LOG=str(tmp_path / "builds.log"),
               PYTHONPATH=path)
    for v in ("PYCLAD_BUILD_PROCESSES", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"):
        env.pop(v, None)
    env.update(extra)
    return env


def _log_lines(tmp_path):
    log = tmp_path / "builds.log"
    return log.read_text().splitlines() if log.exists() else []


# Three programs prefetched, then asked for; the second source is broken where argv[2] says so.
_PREFETCH = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np, pyopencl as cl
    import clkernels
    from clkernels import build_pool, cache, templates
    rt = clkernels.get_runtime(sys.argv[1])
    broken = sys.argv[2] == "broken"
    def source(i):
        body = "a[get_global_id(0)] += %d;" % (i + 1)
        if i == 1 and broken:
            body = "a[get_global_id(0)] += undeclared_name;"
        return "__kernel void add(__global int *a) { " + body + " }"
    requests = [templates.Request("test/add", {"i": i}, (lambda i=i: source(i))) for i in range(3)]
    ahead = templates.start_build_workers(rt) if sys.argv[2] == "ahead" else None
    sent = templates.prefetch(requests, rt)
    if sys.argv[3] == "settle":     # the caller's own work meanwhile: the workers take every job
        import os, time
        log, t0 = os.environ["PYCLAD_BUILD_LOG"], time.monotonic()
        need = sent - broken          # a failed build is not logged
        while need > 0 and time.monotonic() - t0 < 300 and (not os.path.exists(log) or len(open(log).readlines()) < need):
            time.sleep(0.05)
    out, errors = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for r in requests:
            try:
                prg = templates.program_for(r.name, r.params, r.make_source, rt)
            except clkernels.BuildError as exc:
                errors.append(str(exc))
                continue
            a = np.zeros(4, np.int32)
            buf = cl.Buffer(rt.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=a)
            prg.add(rt.queue, (4,), None, buf)
            cl.enqueue_copy(rt.queue, a, buf)
            out.append(a.tolist())
    print(json.dumps({"sent": sent, "ahead": ahead, "seen": cache.code_seen(), "out": out, "errors": errors, "stats": cache.stats(), "made": cache.made(),
                      "taken_back": build_pool.stats()["taken_back"],
                      "warnings": [str(w.message) for w in caught if issubclass(w.category, cache.CacheWarning)]}))
""")


def _prefetch(device, tmp_path, mode="good", settle=True, **env):
    """Run _PREFETCH; ``settle``: the caller asks for the programs only once the workers have built
    them all (else at once, before any worker can have started)."""
    p = subprocess.run([sys.executable, "-c", _PREFETCH, _spec(device), mode, "settle" if settle else "now"],
                       env=_env(tmp_path, **env),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_prefetched_programs_are_built_by_workers_and_loaded_by_the_caller(real_device, tmp_path):
    r = _prefetch(real_device, tmp_path)
    assert r["sent"] == 3
    assert r["out"] == [[1] * 4, [2] * 4, [3] * 4]
    # The caller built nothing from source and loaded three binaries; three builds were logged,
    # so other processes (the workers) built them.
    assert r["stats"]["source_builds"] == 0 and r["stats"]["binary_loads"] == 3, r
    assert len(_log_lines(tmp_path)) == 3
    assert not r["warnings"], r["warnings"]
    # A second process finds them all in the cache: nothing to send, nothing built.
    again = _prefetch(real_device, tmp_path)
    assert again["sent"] == 0 and again["out"] == r["out"]
    assert len(_log_lines(tmp_path)) == 3


def test_a_source_no_worker_has_taken_is_built_by_the_caller_at_once(real_device, tmp_path):
    # Asked for right after the prefetch: no worker can have opened the device yet, so the caller
    # takes the first source back rather than wait for a worker's start and then its build.
    r = _prefetch(real_device, tmp_path, settle=False)
    assert r["sent"] == 3 and r["out"] == [[1] * 4, [2] * 4, [3] * 4]
    assert r["taken_back"] >= 1 and r["stats"]["source_builds"] == r["taken_back"], r
    assert r["stats"]["binary_loads"] == 3 - r["taken_back"]
    # Each program was built once, here or in a worker, never twice.
    assert len(_log_lines(tmp_path)) == 3
    assert not r["warnings"], r["warnings"]


def test_workers_that_cannot_start_leave_the_builds_to_the_caller(monkeypatch):
    identity = "no such device (test)"
    monkeypatch.setattr(build_pool, "enabled", lambda: True)
    with pytest.warns(clkernels.cache.CacheWarning, match="build worker processes cannot start"):
        assert build_pool.start(identity, count=1, linger=0.0) == 1
        deadline = time.monotonic() + 120
        while build_pool.failed(identity) is None and time.monotonic() < deadline:
            time.sleep(0.05)
    assert "no OpenCL device" in build_pool.failed(identity)
    # Nothing more goes to workers for that device: its programs are built by the caller.
    assert build_pool.submit(identity, [("k1", "src", (), "x"), ("k2", "src", (), "y")]) == 0
    assert build_pool.start(identity) == 0
    assert not build_pool.pending("k1")


def test_workers_started_ahead_take_the_sources_on_a_cold_cache_only(real_device, tmp_path):
    r = _prefetch(real_device, tmp_path, "ahead")
    assert r["ahead"] >= 1 and r["sent"] == 3 and r["seen"]
    assert r["out"] == [[1] * 4, [2] * 4, [3] * 4]
    assert r["stats"]["source_builds"] == 0 and len(_log_lines(tmp_path)) == 3
    # This code has filled the cache now: no workers ahead, nothing to build.
    again = _prefetch(real_device, tmp_path, "ahead")
    assert again["ahead"] == 0 and again["sent"] == 0 and len(_log_lines(tmp_path)) == 3


def test_a_failing_worker_leaves_the_build_error_to_the_caller(real_device, tmp_path):
    r = _prefetch(real_device, tmp_path, "broken")
    assert r["sent"] == 3
    assert r["out"] == [[1] * 4, [3] * 4]
    # The caller built the broken source itself and raised its own BuildError.
    assert r["stats"]["source_builds"] == 0 and r["stats"]["binary_loads"] == 2
    assert any("build worker process failed" in w for w in r["warnings"]), r["warnings"]
    assert len(r["errors"]) == 1 and "undeclared_name" in r["errors"][0], r["errors"]


def test_workers_are_off_when_asked(real_device, tmp_path):
    r = _prefetch(real_device, tmp_path, PYCLAD_BUILD_PROCESSES="0")
    assert r["sent"] == 0 and r["out"] == [[1] * 4, [2] * 4, [3] * 4]
    assert r["stats"]["source_builds"] == 3          # built here, one after another, as before
    r = _prefetch(real_device, tmp_path / "mpi", OMPI_COMM_WORLD_SIZE="2")
    assert r["sent"] == 0 and r["stats"]["source_builds"] == 3


def test_an_unwritable_cache_keeps_the_builds_in_the_caller(real_device, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    r = _prefetch(real_device, tmp_path, PYCLAD_CACHE_DIR=str(blocker / "cache"))
    assert r["sent"] == 0 and r["out"] == [[1] * 4, [2] * 4, [3] * 4]
    assert r["stats"]["source_builds"] == 3


def test_a_bad_worker_count_names_the_variable(monkeypatch):
    monkeypatch.setenv(build_pool.ENV, "many")
    with pytest.raises(ValueError, match="PYCLAD_BUILD_PROCESSES='many'"):
        build_pool.max_workers()
    monkeypatch.setenv(build_pool.ENV, "3")
    assert build_pool.max_workers() == 3


@pytest.mark.oclgrind
def test_nothing_goes_to_workers_on_the_simulator():
    sims = [d for d in clkernels.list_devices() if DeviceInfo.of(d).is_simulator]
    if not sims:
        pytest.skip("no Oclgrind device here (the CI's Oclgrind job has one)")
    rt = clkernels.get_runtime(sims[0])
    requests = [templates.Request("test/sim", {"i": i}, lambda i=i: f"__kernel void k{i}() {{}}") for i in range(3)]
    assert templates.prefetch(requests, rt) == 0


_SOLVE = textwrap.dedent("""
    import json, sys
    import numpy as np
    import solvers
    from clkernels import build_pool, cache
    problem = solvers.synthetic_problem(8, 300, 3, seed=1)
    for ls, dt in (("sparse_schur", np.float64), ("iterative_schur", np.float32)):
        r = solvers.bundle_adjust(problem, linear_solver=ls, dtype=dt, max_iterations=2, handle_sigint=False,
                                  device=sys.argv[1])
        assert r.state == "device", r.state
    print(json.dumps({"made": cache.made(), "stats": cache.stats(), "taken_back": build_pool.stats()["taken_back"]}))
""")


def test_a_solve_names_every_program_it_builds(real_device, tmp_path):
    """A cold bundle adjustment (both linear solvers, both dtypes) asks for no program that its
    prefetch did not name: every program the solve made came from a worker's binary, or was one
    the solve took back from the workers' queue and built itself; none was built twice."""
    if not DeviceInfo.of(real_device).fp64:
        pytest.skip("the sparse_schur solve needs fp64")
    p = subprocess.run([sys.executable, "-c", _SOLVE, _spec(real_device)], env=_env(tmp_path),
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["made"], r
    sources = sum(how == "source" for _, how, _ in r["made"])
    assert sources == r["taken_back"] and len(r["made"]) - sources == r["stats"]["binary_loads"], r
    assert len(_log_lines(tmp_path)) == len(r["made"])


_SETUP = textwrap.dedent("""
    import json, sys
    import numpy as np
    import clkernels, solvers
    from clkernels import build_pool, cache, templates
    from solvers.ba import observations_device as dobs
    from solvers.linalg import schur_pattern_device
    rt = clkernels.get_runtime(sys.argv[1])
    p = solvers.synthetic_problem(6, 200, 3, seed=3)
    sent = templates.prefetch([*dobs.program_requests(rt, np.float64), schur_pattern_device.program_request()], rt)
    d = dobs.DeviceObservations(rt, p.camera_index, p.point_index, p.observations, p.num_cameras, p.num_points,
                                np.float64)
    assert schur_pattern_device.pattern_on_device(rt, d, 4) is not None
    print(json.dumps({"sent": sent, "made": cache.made(), "taken_back": build_pool.stats()["taken_back"]}))
""")


def test_the_device_setup_names_every_program_it_builds(real_device, tmp_path):
    """The device setup's requests (observations_device.program_requests and the pattern's, which
    every device solve prefetches for a later, larger problem) are the programs that ordering the
    observations and making the pattern build: after the prefetch, each came from a worker's
    binary or was one the caller took back from the queue; none was built unannounced."""
    p = subprocess.run([sys.executable, "-c", _SETUP, _spec(real_device)], env=_env(tmp_path),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["sent"] == 4 and len(r["made"]) == 4, r
    sources = sum(how == "source" for _, how, _ in r["made"])
    assert sources == r["taken_back"], r
