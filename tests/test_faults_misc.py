"""Faults that used to end in a traceback or an abort: ``--devices`` naming a device twice or
nothing (an ``error:`` line, exit 2), a kernel configuration no call can take (an error naming
the field at construction), and an allocation past the process' address-space limit (a
DeviceMemoryError, checked with a real RLIMIT_AS in a subprocess, instead of PoCL aborting)."""
import os
import subprocess
import sys
import textwrap

import pytest

import clkernels
from clkernels.dcnv4 import LADDER, DCNv4Config
from clkernels.deformable_aggregation import AggregationConfig

from pocl_pair import ROOT


def _run(argv, timeout=120):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("PYCLAD_DEVICE", None)
    return subprocess.run([sys.executable, "-W", "ignore", *argv], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=timeout)


def _needs_a_device():
    if not clkernels.list_devices():
        pytest.skip("needs an OpenCL device")


# ---------------------------------------------------------------------------- --devices

@pytest.mark.parametrize("spec, says", [
    ("0:0,0:0", "names '{name}' twice (entries 0 and 1: '0:0' and '0:0'): give each device once"),
    ("no-such-device", "'no-such-device' matches no OpenCL device"),
    ("0:0,", "has an empty entry"),
], ids=["twice", "unknown", "empty-entry"])
def test_a_bad_devices_spec_is_an_error_line_naming_it_and_what_is_allowed(spec, says):
    _needs_a_device()
    run = _run(["-m", "solvers.bal", "--synthetic", "3,20,2", "--iterations", "1", "--devices", spec])
    assert run.returncode == 2, run.stdout + run.stderr
    name = clkernels.get_runtime("0:0").info.name
    assert run.stderr.startswith(f"error: --devices {spec!r}"), run.stderr
    assert says.format(name=name) in run.stderr
    assert "or 'all'" in run.stderr                       # what --devices takes
    assert "Traceback" not in run.stderr
    assert run.stdout == ""                               # refused before anything was read or solved


# ---------------------------------------------------------------------------- kernel configurations

@pytest.mark.parametrize("make, error, says", [
    (lambda: DCNv4Config(8, 8, work_group_size=-1), ValueError,
     "DCNv4Config.work_group_size must be an integer >= 0 (0: chosen from the device), got -1"),
    (lambda: DCNv4Config(8, 8, work_group_size=64.0), TypeError,
     "DCNv4Config.work_group_size must be an integer, got float"),
    (lambda: DCNv4Config(0, 1), ValueError, "DCNv4Config.channels_per_item must be an integer >= 1"),
    (lambda: DCNv4Config(8, 3), ValueError, "DCNv4Config.vector_width must be one of 1, 2, 4, 8, 16"),
    (lambda: DCNv4Config(8, 8, reuse="yes"), TypeError, "DCNv4Config.reuse must be True or False"),
    (lambda: DCNv4Config(8, 8, scatter="sorted"), ValueError,
     "DCNv4Config.scatter must be one of '', 'gather', 'fixed', 'atomic', 'owner'"),
    (lambda: DCNv4Config(8, 8, gather_margin=-1), ValueError, "DCNv4Config.gather_margin must be an integer >= 0"),
    (lambda: DCNv4Config(8, 8, gather_channels=8.0), TypeError,
     "DCNv4Config.gather_channels must be an integer, got float"),
    (lambda: AggregationConfig(local_size=-1), ValueError,
     "AggregationConfig.local_size must be an integer >= 1"),
    (lambda: AggregationConfig(split=3), ValueError, "AggregationConfig.split must be a power of two"),
    (lambda: AggregationConfig(cpt=4, vec=5), ValueError,
     "AggregationConfig.vec must be one of 1, 2, 3, 4, 8, 16"),
    (lambda: AggregationConfig(feature_grad="atomic"), ValueError,
     "AggregationConfig.feature_grad must be one of 'scatter', 'gather'"),
    (lambda: AggregationConfig(index_size=True), TypeError,
     "AggregationConfig.index_size must be an integer"),
])
def test_a_kernel_config_no_call_can_take_is_refused_naming_the_field(make, error, says):
    with pytest.raises(error) as e:
        make()
    assert says in str(e.value)


def test_the_configs_the_library_makes_are_accepted():
    for _, cfg in LADDER:
        assert cfg == DCNv4Config(cfg.channels_per_item, cfg.vector_width, cfg.reuse)
    DCNv4Config(8, 8, work_group_size=0)
    AggregationConfig(cpt=2, vec=7, interleave=True)    # vec unused when interleaved


# ---------------------------------------------------------------------------- allocations

LETTERBOX_UNDER_A_LIMIT = textwrap.dedent("""
    import resource
    import numpy as np
    import clkernels, solvers
    clkernels.get_runtime()
    clkernels.letterbox(np.zeros((10, 10, 3), np.uint8), size=(64, 64))     # built, warm
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    # A real address-space limit (as ulimit -v sets) 1 GiB above what the process uses: the
    # 14000x14000 blob (2.2 GiB) cannot fit, and PoCL used to abort (rc 134) or crash on it.
    resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
    assert solvers.DeviceMemoryError is clkernels.DeviceMemoryError
    for attempt in range(2):               # the failed plan is not cached: a retry says it again
        try:
            clkernels.letterbox(np.zeros((10, 10, 3), np.uint8), size=(14000, 14000))
        except solvers.DeviceMemoryError as e:
            print("DeviceMemoryError:", e, e.needed, e.available)
        else:
            print("no error")
    print(clkernels.letterbox(np.zeros((10, 10, 3), np.uint8), size=(640, 640))[0].shape)
""")


def test_an_allocation_past_the_address_space_limit_raises_device_memory_error():
    _needs_a_device()
    if not clkernels.get_runtime().info.is_cpu:
        pytest.skip("the host's limits bound a CPU device's buffers")
    run = _run(["-c", LETTERBOX_UNDER_A_LIMIT])
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith("DeviceMemoryError: letterbox's output ((1, 3, 14000, 14000) "
                                                   "float32) needs 2.19 GiB (2352000300 bytes)") for line in lines[:2])
    assert "RLIMIT_AS (ulimit -v)" in lines[0] and "use a smaller size or pass fewer images per call" in lines[0]
    needed, available = map(int, lines[0].split()[-2:])
    assert needed == 2352000300 and 0 < available < needed
    assert lines[2] == "(1, 3, 640, 640)"                 # and the process goes on
