"""The on-disk binary cache (clkernels.cache) with real processes, real files and real faults.

Every check runs fresh Python processes on the test's own ``PYCLAD_CACHE_DIR`` (a temporary
folder), so what one process left on disk is all another can use; ``PYCLAD_BUILD_LOG`` records
each build from source. Runs on every OpenCL device found (the simulator is never cached).
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import clkernels
from clkernels import cache
from clkernels.runtime import DeviceInfo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_REAL = [d for d in clkernels.list_devices() if not DeviceInfo.of(d).is_simulator]

# A process that builds one program (through the public build()), runs it on 8 numbers and prints
# the result with the cache's counts, and how many programs pyopencl built from source in it.
_BUILD = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np, pyopencl as cl
    from_source = []
    _build = cl.Program.build
    def counted(self, *a, **k):
        if getattr(self, "_source", None) is not None:
            from_source.append(1)
        return _build(self, *a, **k)
    cl.Program.build = counted
    import clkernels
    from clkernels import cache, templates
    rt = clkernels.get_runtime(sys.argv[1])
    src = "__kernel void twice(__global int *a) { a[get_global_id(0)] *= 2; }  // " + sys.argv[2]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prg = templates.build(src, rt, name="test twice")
    a = np.arange(8, dtype=np.int32)
    buf = cl.Buffer(rt.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=a)
    prg.twice(rt.queue, (8,), None, buf)
    cl.enqueue_copy(rt.queue, a, buf)
    import os
    files = sorted(os.path.relpath(os.path.join(d, f), cache.cache_dir()) for d, _, fs in os.walk(cache.cache_dir()) for f in fs)
    print(json.dumps({"out": a.tolist(), "stats": cache.stats(), "files": files, "pyopencl_source_builds": len(from_source),
                      "warnings": [str(w.message) for w in caught if issubclass(w.category, cache.CacheWarning)]}))
""")


def _env(cache_dir, log=None):
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYCLAD_CACHE_DIR=str(cache_dir), PYTHONPATH=path)
    if log is not None:
        env["PYCLAD_BUILD_LOG"] = str(log)
    return env


def _spec(device):
    info = DeviceInfo.of(device)
    return f"{device.platform.name.strip()}:{info.name}"


def _run_build(device, cache_dir, tag="a"):
    p = subprocess.run([sys.executable, "-c", _BUILD, _spec(device), tag], env=_env(cache_dir),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["out"] == [2 * i for i in range(8)], out      # a working kernel, whatever happened
    return out


def _entries(cache_dir):
    old = os.environ.get("PYCLAD_CACHE_DIR")
    os.environ["PYCLAD_CACHE_DIR"] = str(cache_dir)
    try:
        return cache.entries()
    finally:
        if old is None:
            del os.environ["PYCLAD_CACHE_DIR"]
        else:
            os.environ["PYCLAD_CACHE_DIR"] = old


@pytest.fixture(params=_REAL, ids=[DeviceInfo.of(d).name.split()[0] for d in _REAL])
def real_device(request):
    return request.param


def test_second_process_loads_the_binary(real_device, tmp_path):
    first = _run_build(real_device, tmp_path)
    assert first["stats"]["source_builds"] == 1 and first["pyopencl_source_builds"] == 1
    second = _run_build(real_device, tmp_path)
    assert second["stats"]["source_builds"] == 0, second
    assert second["stats"]["binary_loads"] == 1
    assert second["pyopencl_source_builds"] == 0          # nothing built from source in that process
    (entry,) = _entries(tmp_path)
    assert entry["name"] == "test twice" and entry["kernels"] == "twice"
    assert entry["device"] == cache.device_identity(real_device)


def _entry_path(cache_dir):
    (entry,) = _entries(cache_dir)
    return entry["path"]


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign", "garbage"])
def test_bad_entry_is_rebuilt_and_replaced(real_device, tmp_path, damage):
    _run_build(real_device, tmp_path)
    path = _entry_path(tmp_path)
    data = bytearray(open(path, "rb").read())
    if damage == "flip":
        data[-100] ^= 0x40                      # one bit of the binary
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "foreign":                   # a whole entry, for another device and driver
        head = len(cache.MAGIC) + 4
        n = int.from_bytes(data[len(cache.MAGIC):head], "little")
        header = json.loads(data[head:head + n])
        header["device"] = "Other Platform | Other Vendor | OpenCL 3.0 | Other GPU | v | OpenCL 3.0 | 999.1"
        blob = json.dumps(header).encode()
        data = data[:len(cache.MAGIC)] + len(blob).to_bytes(4, "little") + blob + data[head + n:]
    else:
        data = bytearray(b"not a cache entry at all")
    with open(path, "wb") as f:
        f.write(data)
    again = _run_build(real_device, tmp_path)
    assert again["stats"]["rejected"] == 1 and again["stats"]["source_builds"] == 1, again
    assert any("rebuilt from source" in w for w in again["warnings"]), again["warnings"]
    # Replaced by a whole entry: the next process loads it.
    third = _run_build(real_device, tmp_path)
    assert third["stats"] == {"source_builds": 0, "binary_loads": 1, "rejected": 0, "write_failures": 0}


def test_two_processes_fill_an_empty_cache_at_once(real_device, tmp_path):
    log = tmp_path / "builds.log"
    cache_dir = tmp_path / "cache"
    cmd = [sys.executable, "-m", "solvers.bal", "-q", "--synthetic", "8,300,3", "--iterations", "3"]
    procs = [subprocess.Popen(cmd, env=dict(_env(cache_dir, log), PYCLAD_DEVICE=_spec(real_device)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert "Final" in out
    finals = [[ln for ln in out.splitlines() if ln.startswith("Final")] for out, _ in outs]
    assert finals[0] == finals[1]
    entries = _entries(cache_dir)
    assert entries and not any("error" in e for e in entries)
    assert not [f for _, _, fs in os.walk(cache_dir) for f in fs if f.startswith(".tmp-")]
    # A third process finds everything it needs.
    before = open(log).read().count("\n")
    p = subprocess.run(cmd, env=dict(_env(cache_dir, log), PYCLAD_DEVICE=_spec(real_device)),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert open(log).read().count("\n") == before, "the warm process built programs from source"
    assert [ln for ln in p.stdout.splitlines() if ln.startswith("Final")] == finals[0]


def test_unwritable_cache_dir_warns_and_builds(real_device, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    out = _run_build(real_device, blocker / "cache")        # no folder can be made under a file
    assert out["stats"]["source_builds"] == 1 and out["stats"]["write_failures"] == 1
    assert any("cannot be written" in w for w in out["warnings"]), out["warnings"]


def test_full_disk_while_writing_costs_a_warning(real_device, tmp_path):
    """The cache on a real file system with 4 KiB left (a 64 KiB tmpfs, mounted in a private
    mount namespace by unshare, filled first): the entry's write fails with ENOSPC."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    fill = 'mount -t tmpfs -o size=64k tmpfs "$0" && head -c 61440 /dev/zero > "$0/filler" && exec "$@"'
    cmd = ["unshare", "-rm", "sh", "-c", fill, str(mnt), sys.executable, "-c", _BUILD, _spec(real_device), "a"]
    p = subprocess.run(cmd, env=_env(mnt / "cache"), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["out"] == [2 * i for i in range(8)]
    assert out["stats"]["write_failures"] == 1 and out["stats"]["source_builds"] == 1, out
    assert any("No space left" in w for w in out["warnings"]), out["warnings"]
    assert out["files"] == [], "a partial entry was left behind"


def test_a_new_problem_size_builds_nothing(real_device, tmp_path):
    """Solves of two sizes of one family in one process: the second builds and loads nothing."""
    script = textwrap.dedent("""
        import json, sys
        import solvers
        from clkernels import cache
        counts = []
        for size in [(8, 300, 3), (30, 5000, 4), (11, 777, 5)]:
            for ls in ("iterative_schur", "sparse_schur"):
                solvers.bundle_adjust(solvers.synthetic_problem(*size, seed=2), linear_solver=ls,
                                      max_iterations=2, handle_sigint=False, device=sys.argv[1])
            s = cache.stats()
            counts.append(s["source_builds"] + s["binary_loads"])
        print(json.dumps(counts))
    """)
    p = subprocess.run([sys.executable, "-c", script, _spec(real_device)], env=_env(tmp_path),
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    counts = json.loads(p.stdout.strip().splitlines()[-1])
    assert counts[0] > 0 and counts[1] == counts[0] and counts[2] == counts[0], counts


def test_render_keys_need_exact_values():
    from clkernels.templates import Storage
    k = cache.render_key("t", {"a": 1, "b": (2, "x"), "s": Storage(np.float32)})
    assert k == cache.render_key("t", {"b": (2, "x"), "a": 1, "s": Storage(np.float32)})
    assert k != cache.render_key("t", {"a": 1, "b": (2, "x"), "s": Storage(np.float64)})
    assert cache.render_key("t", {"a": 1}) != cache.render_key("t", {"a": 1.0}) != cache.render_key("t", {"a": True})
    # An object without an exact text is not indexed (its repr could hide a difference).
    assert cache.render_key("t", {"a": np.arange(3)}) is None
    assert cache.render_key("t", {"a": object()}) is None


def test_warmup_fills_the_cache_for_a_later_solve(real_device, tmp_path):
    """``python -m clkernels warmup --what bal`` in one process; a BAL solve in the next builds
    nothing from source, and ``python -m clkernels cache`` lists what warmup made."""
    log = tmp_path / "builds.log"
    env = dict(_env(tmp_path / "cache", log))
    p = subprocess.run([sys.executable, "-m", "clkernels", "warmup", "--what", "bal", "--device", _spec(real_device)],
                       env=env, capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "built from source" in p.stdout and "solvers/ba/lm_device.cl.mako" in p.stdout
    built = open(log).read().count("\n")
    assert built > 0
    for ls, dtype in (("sparse_schur", "float64"), ("iterative_schur", "float32")):
        p = subprocess.run([sys.executable, "-m", "solvers.bal", "-q", "--synthetic", "12,900,4", "--iterations", "2",
                            "--linear-solver", ls, "--dtype", dtype, "--loss", "cauchy", "--device", _spec(real_device)],
                           env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
    assert open(log).read().count("\n") == built, "a solve after warmup built programs from source"
    listing = subprocess.run([sys.executable, "-m", "clkernels", "cache"], env=env, capture_output=True, text=True)
    assert listing.returncode == 0 and f"in {built} programs" in listing.stdout, listing.stdout
    cleared = subprocess.run([sys.executable, "-m", "clkernels", "cache", "--clear"], env=env,
                             capture_output=True, text=True)
    assert cleared.returncode == 0 and not _entries(tmp_path / "cache")
