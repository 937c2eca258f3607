"""Test fixtures: ``device`` runs a test once per OpenCL device found.

- ``PYCLAD_TEST_DEVICES``: comma-separated device specs to keep (for example ``pocl`` or
  ``oclgrind``); by default every device except the Oclgrind simulator's... unless the
  test is marked ``oclgrind`` (tiny shapes), which then runs there too.
- On the Oclgrind device a test fails if Oclgrind wrote any diagnostic while it ran
  (``OCLGRIND_LOG`` must name the log file; ``.ci/run`` sets it up).
"""
import os

import pytest

import clkernels
from clkernels.runtime import DeviceInfo


def _test_devices():
    devices = clkernels.list_devices()
    specs = [s for s in os.environ.get("PYCLAD_TEST_DEVICES", "").split(",") if s.strip()]
    if specs:
        keep = []
        for spec in specs:
            for d in clkernels.match_devices(spec, devices):
                if d not in keep:
                    keep.append(d)
        if not keep:
            raise pytest.UsageError(
                f"PYCLAD_TEST_DEVICES={os.environ['PYCLAD_TEST_DEVICES']!r} matches no device:\n"
                + clkernels.describe_devices(devices))
        devices = keep
    return devices


_DEVICES = _test_devices()


def _device_id(d):
    info = DeviceInfo.of(d)
    return f"{info.vendor}:{info.name.split()[0]}" if not info.is_simulator else "oclgrind"


def pytest_generate_tests(metafunc):
    if "device" not in metafunc.fixturenames:
        return
    tiny = metafunc.definition.get_closest_marker("oclgrind") is not None
    chosen = [d for d in _DEVICES if tiny or not DeviceInfo.of(d).is_simulator]
    if not chosen:
        # Only the simulator was asked for and this test is not tiny: it does not belong
        # to this run (deselected below rather than skipped, so no skip hides anything).
        metafunc.parametrize("device", [pytest.param(None, marks=pytest.mark.not_for_these_devices)])
        return
    metafunc.parametrize("device", chosen, ids=[_device_id(d) for d in chosen], indirect=True)


def pytest_collection_modifyitems(config, items):
    keep = [i for i in items if i.get_closest_marker("not_for_these_devices") is None]
    dropped = [i for i in items if i.get_closest_marker("not_for_these_devices") is not None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def pytest_configure(config):
    config.addinivalue_line("markers", "not_for_these_devices: internal, deselected")


@pytest.fixture
def device(request):
    """A ``clkernels.Runtime`` for one device; checks Oclgrind's log around the test."""
    runtime = clkernels.get_runtime(request.param)
    log = os.environ.get("OCLGRIND_LOG")
    if not runtime.info.is_simulator:
        yield runtime
        return
    if not log:
        pytest.fail("tests on Oclgrind need OCLGRIND_LOG set to a file (see .ci/run)")
    before = os.path.getsize(log) if os.path.exists(log) else 0
    yield runtime
    runtime.queue.finish()
    if os.path.exists(log) and os.path.getsize(log) > before:
        with open(log) as f:
            f.seek(before)
            text = f.read()
        pytest.fail(f"Oclgrind reported problems:\n{text[:20000]}")


# -- Oclgrind 21.10 reuses the shadow memory of released buffers at their old size and then
# reports fully written later buffers as uninitialised. Tests that hit it keep their buffers
# alive on the simulator (the shapes are tiny).

_KEPT_ON_SIMULATOR = []


@pytest.fixture
def keep_on_simulator(device):
    """``keep_on_simulator(*objects)``: never release these objects' buffers on Oclgrind."""
    def keep(*objects):
        if device.info.is_simulator:
            _KEPT_ON_SIMULATOR.append(objects)
    return keep


# -- real BAL problems (tests/bal_data.py says where they are looked for) --------------

@pytest.fixture(scope="session")
def bal_paths():
    import bal_data
    return bal_data.bal_paths()
