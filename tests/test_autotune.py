"""clkernels.autotune: launch shapes chosen by measuring, stored in the program cache.

The choices change only the speed, never the bits, so these tests check what is measured, stored,
reused and refused, and that every result equals the default configuration's bits."""
import dataclasses
import importlib
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pyopencl.array as cla
import pytest

from clkernels import autotune, cache

dcn = importlib.import_module("clkernels.dcnv4")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPTS = dict(group=2, group_channels=16, offset_scale=1.25)


@pytest.fixture
def tuning_cache(tmp_path, monkeypatch):
    """An empty cache folder, and the mode back to the environment's afterwards."""
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(autotune.ENV, raising=False)
    yield tmp_path / "cache"
    autotune.set_mode(None)


def _inputs(seed=0, n=2, h=7, w=9):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, h, w, 32)).astype(np.float32)
    om = rng.uniform(-1.5, 1.5, (n, h, w, dcn.offset_mask_channels(2))).astype(np.float32)
    return x, om


def _records(folder):
    top = folder / "tuning"
    return [json.loads(p.read_text()) for p in top.rglob("*") if p.is_file()] if top.exists() else []


def _forward_steps(rt):
    """The launch shapes of the forward plans this runtime holds: (global size, local size)."""
    return [(s.global_size, s.local_size) for key, plan in rt.plans.items()
            if key[0] is dcn.FORWARD for s in plan.steps]


def test_tune_measures_on_the_calls_arrays_stores_the_fastest_and_keeps_the_bits(device, tuning_cache):
    if device.info.is_simulator:
        pytest.skip("the simulator never measures")
    x, om = _inputs(seed=1, h=8, w=10)
    plain = dcn.dcnv4(x, om, **OPTS, device=device, config=dcn.forward_config(device.info, 16, np.float32))
    autotune.set_mode("tune")
    before = len(autotune.measured())
    xd, omd = cla.to_device(device.queue, x), cla.to_device(device.queue, om)
    out = dcn.dcnv4(xd, omd, **OPTS, device=device).get()
    np.testing.assert_array_equal(out.view(np.uint8), plain.view(np.uint8))
    what, shapes, times = autotune.measured()[-1]
    assert len(autotune.measured()) == before + 1 and what == "dcnv4_forward"
    assert len(times) >= 3 and all(t > 0 for t in times.values())
    (record,) = _records(tuning_cache)
    best = min(times, key=times.get)
    assert record["choice"] == dataclasses.asdict(best) and record["what"] == "dcnv4_forward"
    assert record["identity"] == cache.device_identity(device.device) and len(record["times_ms"]) == len(times)
    # Another call of the same shapes measures nothing more; every candidate gives the same bits.
    dcn.dcnv4(xd, omd, **OPTS, device=device)
    assert len(autotune.measured()) == before + 1
    for cfg in times:
        got = dcn.dcnv4(x, om, **OPTS, device=device, config=cfg)
        np.testing.assert_array_equal(got.view(np.uint8), plain.view(np.uint8), err_msg=str(cfg))


def test_host_arrays_are_measured_on_copies(device, tuning_cache):
    if device.info.is_simulator:
        pytest.skip("the simulator never measures")
    autotune.set_mode("tune")
    x, om = _inputs(seed=3, h=5, w=6)
    before = len(autotune.measured())
    out = dcn.dcnv4(x, om, **OPTS, device=device)
    assert isinstance(out, np.ndarray) and len(autotune.measured()) == before + 1
    plain = dcn.dcnv4(x, om, **OPTS, device=device, config=dcn.forward_config(device.info, 16, np.float32))
    np.testing.assert_array_equal(out.view(np.uint8), plain.view(np.uint8))


def _store(device, choice: dict, identity=None, n=2, h=7, w=9):
    """A record for the forward at _inputs()'s shapes, as autotune would write it."""
    o = dcn.DCNv4Options(**OPTS)
    identity = identity or cache.device_identity(device.device)
    geometry = (n, h, w, h, w, dcn.offset_mask_channels(2))
    key = cache.tuning_key(cache.device_identity(device.device), "dcnv4_forward", ("float32", o, geometry))
    assert cache.store_tuning(key, identity, {"choice": choice})
    return key


def test_a_stored_choice_is_used_without_measuring_in_another_process(device, tuning_cache):
    """The default mode uses what is stored: tiles of 3 x 5 pixels in work-groups of 8 give a
    launch no device default would (whole tiles of the 7 x 9 output: 9 rows x 10 columns, in
    2 images and 2 groups), and nothing is measured; ``PYCLAD_AUTOTUNE=0`` ignores it."""
    if device.info.is_simulator:
        pytest.skip("the simulator never measures or uses stored choices")
    default = dcn.forward_config(device.info, 16, np.float32)
    _store(device, dataclasses.asdict(dataclasses.replace(default, tile_rows=3, tile_cols=5, work_group_size=8)))
    items = 2 * 9 * 10 * 2 * (16 // default.channels_per_item)
    tiled = f"(({-(-items // 8) * 8},), (8,))"
    script = (
        "import importlib, numpy as np, sys, clkernels, pyopencl.array as cla\n"
        "from clkernels import autotune\n"
        "sys.path.insert(0, 'tests'); from test_autotune import _inputs, _forward_steps, OPTS\n"
        "dcn = importlib.import_module('clkernels.dcnv4')\n"
        "rt = clkernels.get_runtime()\n"
        "x, om = _inputs()\n"
        "xd, omd = cla.to_device(rt.queue, x), cla.to_device(rt.queue, om)\n"
        "out = dcn.dcnv4(xd, omd, **OPTS, device=rt).get()\n"
        "plain = dcn.dcnv4(x, om, **OPTS, device=rt, config=dcn.forward_config(rt.info, 16, np.float32))\n"
        "assert np.array_equal(out.view(np.uint8), plain.view(np.uint8))\n"
        "print(_forward_steps(rt)[0], len(autotune.measured()))\n")
    spec = f"{device.device.platform.name.strip()}:{device.info.name}"
    for mode, expect in (("", f"{tiled} 0"), ("0", None)):
        env = dict(os.environ, **{autotune.ENV: mode, "PYCLAD_DEVICE": spec})
        run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=300)
        assert run.returncode == 0, run.stderr
        line = run.stdout.strip().splitlines()[-1]
        if expect is not None:
            assert line == expect
        else:
            assert not line.startswith(tiled) and line.endswith(" 0")


def test_bad_records_are_ignored_with_a_warning(device, tuning_cache):
    if device.info.is_simulator:
        pytest.skip("the simulator never reads stored choices")
    o = dcn.DCNv4Options(**OPTS)
    for bad in ("not json", json.dumps({"choice": {"tile_rows": 2}, "identity": "another device"}),
                json.dumps({"identity": cache.device_identity(device.device)})):
        key = _store(device, {})
        path = tuning_cache / "tuning" / key[:2] / key
        path.write_text(bad)
        with pytest.warns(cache.CacheWarning, match="not a tuning record of this device"):
            got = autotune.choose(device, "dcnv4_forward", ("float32", o, (2, 7, 9, 7, 9, 56)),
                                  dcn.DCNv4Config(8, 8), lambda: [], None)
        assert got == dcn.DCNv4Config(8, 8)
    # A record whose choice this code no longer takes (a field that does not exist), at shapes
    # of this test's own (a runtime keeps the plans of shapes it has seen, choices made).
    x, om = _inputs(seed=7, h=6, w=8)
    plain = dcn.dcnv4(x, om, **OPTS, device=device, config=dcn.forward_config(device.info, 16, np.float32))
    _store(device, {"channels_per_item": 8, "vector_width": 8, "no_such_switch": 1}, h=6, w=8)
    with pytest.warns(cache.CacheWarning, match="not a configuration this code takes"):
        out = dcn.dcnv4(x, om, **OPTS, device=device)
    np.testing.assert_array_equal(out.view(np.uint8), plain.view(np.uint8))


def test_a_cache_that_cannot_be_written_costs_a_warning_not_the_call(device, tmp_path, monkeypatch):
    if device.info.is_simulator:
        pytest.skip("the simulator never measures")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(cache.ENV, str(blocker / "cache"))     # a folder inside a file: never made
    autotune.set_mode("tune")
    try:
        x, om = _inputs(seed=5, h=4, w=5)
        before = len(autotune.measured())
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            out = dcn.dcnv4(x, om, **OPTS, device=device)
        plain = dcn.dcnv4(x, om, **OPTS, device=device, config=dcn.forward_config(device.info, 16, np.float32))
        np.testing.assert_array_equal(out.view(np.uint8), plain.view(np.uint8))
        # Measured and chosen all the same; the only complaint is the cache's (a warning once per
        # process: an earlier test may have had it).
        assert len(autotune.measured()) == before + 1 and blocker.read_text() == ""
        assert all(issubclass(w.category, cache.CacheWarning) for w in seen), [str(w.message) for w in seen]
    finally:
        autotune.set_mode(None)


def test_choose_keeps_the_fastest_and_leaves_out_candidates_that_fail(device, tuning_cache):
    if device.info.is_simulator:
        pytest.skip("the simulator never measures")
    autotune.set_mode("tune")
    speed = {dcn.DCNv4Config(8, 8): 3.0, dcn.DCNv4Config(4, 4): 1.0, dcn.DCNv4Config(2, 2): 2.0}

    class DriverError(Exception):       # as pyopencl's, which are not RuntimeErrors
        pass

    def measure(c):
        if c.channels_per_item == 1:
            raise ValueError("too many registers")
        if c.channels_per_item == 16:
            raise DriverError("CL_INVALID_WORK_GROUP_SIZE")
        return speed[c]
    with pytest.warns(RuntimeWarning) as seen:
        got = autotune.choose(device, "probe", ("shape", 1), dcn.DCNv4Config(8, 8),
                              lambda: [dcn.DCNv4Config(4, 4), dcn.DCNv4Config(1, 1), dcn.DCNv4Config(16, 8),
                                       dcn.DCNv4Config(2, 2)], measure)
    said = [str(w.message) for w in seen]
    assert any("left out: ValueError: too many registers" in m for m in said)
    assert any("left out: DriverError: CL_INVALID_WORK_GROUP_SIZE" in m for m in said) and len(said) == 2
    assert got == dcn.DCNv4Config(4, 4)
    assert autotune.measured()[-1][2] == speed
    # Stored: the next choice reads it (in the default mode too) without measuring.
    autotune.set_mode("cached")
    assert autotune.choose(device, "probe", ("shape", 1), dcn.DCNv4Config(8, 8), lambda: [], None) == \
        dcn.DCNv4Config(4, 4)
    autotune.set_mode("off")
    assert autotune.choose(device, "probe", ("shape", 1), dcn.DCNv4Config(8, 8), lambda: [], None) == \
        dcn.DCNv4Config(8, 8)


def test_the_mode_names_its_variable_when_it_is_wrong(monkeypatch):
    monkeypatch.setenv(autotune.ENV, "sometimes")
    with pytest.raises(ValueError, match="PYCLAD_AUTOTUNE='sometimes': use 1"):
        autotune.mode()
    for value, mode in (("1", "tune"), ("0", "off"), ("", "cached")):
        monkeypatch.setenv(autotune.ENV, value)
        assert autotune.mode() == mode
    with pytest.raises(ValueError, match="autotune mode 'fast'"):
        autotune.set_mode("fast")


def test_the_cache_command_lists_the_choices_and_clear_removes_them(device, tuning_cache):
    _store(device, {"channels_per_item": 8, "vector_width": 8, "tile_rows": 4, "tile_cols": 8})
    run = subprocess.run([sys.executable, "-m", "clkernels", "cache"], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ), timeout=120)
    assert run.returncode == 0, run.stderr
    assert "launch shapes chosen by measuring (clkernels.autotune): 1" in run.stdout
    assert f"on {device.info.name}: channels_per_item=8, vector_width=8, tile_rows=4, tile_cols=8" in run.stdout
    cache.clear()
    assert not _records(tuning_cache)

