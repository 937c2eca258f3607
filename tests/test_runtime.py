"""Device discovery and selection, the CLI listing, the build cache and build errors."""
import os
import subprocess
import sys

import pyopencl as cl
import pytest

import clkernels
from clkernels import templates
from clkernels.runtime import DeviceNotFoundError, select_device

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cli(*args, **env):
    full_env = {**os.environ, **env}
    full_env.pop("PYCLAD_DEVICE", None) if "PYCLAD_DEVICE" not in env else None
    return subprocess.run([sys.executable, "-m", "clkernels", *args], capture_output=True,
                          text=True, env=full_env, cwd=ROOT, timeout=120)


def test_every_device_matches_its_own_platform_and_index():
    devices = clkernels.list_devices()
    platforms = []
    for d in devices:
        if d.platform not in platforms:
            platforms.append(d.platform)
    for d in devices:
        p = platforms.index(d.platform)
        i = [x for x in devices if x.platform == d.platform].index(d)
        assert clkernels.match_devices(f"{p}:{i}", devices) == [d]
        word = d.platform.name.split()[0]
        assert d in clkernels.match_devices(word.upper(), devices)  # case-insensitive
        assert d in clkernels.match_devices(f":{d.name.split()[0]}", devices)


def test_type_words_filter_by_type():
    devices = clkernels.list_devices()
    for word, bit in (("cpu", cl.device_type.CPU), ("gpu", cl.device_type.GPU)):
        assert clkernels.match_devices(word, devices) == [d for d in devices if d.type & bit]


def test_unknown_spec_lists_every_device():
    with pytest.raises(DeviceNotFoundError) as err:
        select_device("no-such-device-anywhere")
    for d in clkernels.list_devices():
        assert d.name.strip() in str(err.value)


def test_selection_order(monkeypatch):
    devices = clkernels.list_devices()
    first, last = devices[0], devices[-1]
    monkeypatch.setenv("PYOPENCL_CTX", "0:0")
    monkeypatch.delenv("PYCLAD_DEVICE", raising=False)
    assert select_device()[0] == first and "PYOPENCL_CTX" in select_device()[1]
    n_platforms = len({d.platform.int_ptr for d in devices})
    last_spec = f"{n_platforms - 1}:{[d for d in devices if d.platform == last.platform].index(last)}"
    monkeypatch.setenv("PYCLAD_DEVICE", last_spec)
    assert select_device()[0] == last and "PYCLAD_DEVICE" in select_device()[1]
    with clkernels.use_device("0:0") as rt:  # code beats the environment
        assert rt.device == first
        assert select_device()[0] == first
        assert select_device(last)[0] == last  # an explicit argument beats everything
    assert select_device()[0] == last
    monkeypatch.setenv("PYCLAD_DEVICE", "nonsense")
    with pytest.raises(DeviceNotFoundError, match="PYCLAD_DEVICE"):
        select_device()


def test_default_skips_the_simulator(monkeypatch):
    monkeypatch.delenv("PYCLAD_DEVICE", raising=False)
    monkeypatch.delenv("PYOPENCL_CTX", raising=False)
    device, reason = select_device()
    assert "default" in reason
    if any("oclgrind" not in d.platform.name.lower() for d in clkernels.list_devices()):
        assert "oclgrind" not in device.platform.name.lower()


def test_cli_lists_devices_and_marks_choice():
    out = _cli()
    assert out.returncode == 0, out.stderr
    for d in clkernels.list_devices():
        assert d.name.strip() in out.stdout
    assert "->" in out.stdout and "chosen:" in out.stdout and "default" in out.stdout


def test_cli_rejects_nonsense_with_device_list():
    out = _cli(PYCLAD_DEVICE="nonsense")
    assert out.returncode != 0
    assert "nonsense" in out.stderr
    assert clkernels.list_devices()[0].name.strip() in out.stderr


def test_runtime_is_cached_and_reports_capabilities(device):
    assert clkernels.get_runtime(device.device) is device
    info = device.info
    assert info.max_work_group_size >= 1 and info.local_mem_bytes > 0 and info.compute_units >= 1
    assert info.fp64 == ("cl_khr_fp64" in device.device.extensions or device.device.double_fp_config != 0)


def test_build_is_cached(device):
    src = "__kernel void k(__global float *a) { a[get_global_id(0)] += 1.0f; }"
    assert clkernels.build(src, device) is clkernels.build(src, device)


def test_build_error_shows_log_and_numbered_source(device):
    text = "\n".join(["// line %d" % i for i in range(1, 10)] +
                     ["__kernel void broken(__global float *a) {", "  a[0] = undefined_name;", "}"])
    with pytest.raises(clkernels.BuildError) as err:
        clkernels.build(text, device)
    msg = str(err.value)
    assert device.info.name in msg
    assert "undefined_name" in msg           # from the build log
    assert ">>   11 |   a[0] = undefined_name;" in msg   # the numbered source line
    assert err.value.source == text


def test_fp64_refused_clearly_when_missing(device, monkeypatch):
    import dataclasses
    import numpy as np
    fake = dataclasses.replace(device.info, fp64=False)
    monkeypatch.setattr(device, "info", fake)
    with pytest.raises(clkernels.FP64Error, match="float32"):
        templates.storage(np.float64, device)


def test_devices_left_out_really_cannot_build_and_the_rest_can():
    """A device list_devices() leaves out (a PoCL whose LLVM does not know this CPU) fails a
    one-line build, and its reason says what to install; every listed CPU device builds it."""
    src = "__kernel void probe(__global int *a) { a[0] = 1; }"
    for d, why in clkernels.unusable_devices():
        assert d not in clkernels.list_devices()
        assert "pocl-opencl-icd" in why
        with pytest.raises(cl.Error):
            cl.Program(cl.Context([d]), src).build()
    for d in clkernels.list_devices():
        if d.type & cl.device_type.CPU:
            cl.Program(cl.Context([d]), src).build()


def test_the_listing_names_the_devices_left_out():
    out = _cli()
    for d, why in clkernels.unusable_devices():
        assert f"left out: {d.name.strip()}" in out.stdout


def test_mako_work_is_one_thread_at_a_time(monkeypatch):
    """templates.render from several threads (warmup's, several devices'): Mako's lookups and
    compiles one at a time. Mako parses templates with ast.parse, and CPython before 3.12 can fail
    when two threads convert syntax trees at once ("AST constructor recursion depth mismatch")."""
    import threading
    import time

    from mako.lookup import TemplateLookup
    inside, most, guard = [0], [0], threading.Lock()
    real = TemplateLookup.get_template

    def counting(self, uri):
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.01)            # a window for another thread to enter
        try:
            return real(self, uri)
        finally:
            with guard:
                inside[0] -= 1

    monkeypatch.setattr(TemplateLookup, "get_template", counting)
    params = dict(L=4, K=8, BITS=4, SK=8, item=0, W=1, vector=False)
    out = []
    threads = [threading.Thread(target=lambda: out.append(templates.render("clkernels/sort.cl.mako", **params)))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 8 and len(set(out)) == 1 and "radix_scatter" in out[0]
    assert most[0] == 1


def test_library_queues_record_no_timestamps_and_profiled_ones_do(device):
    """The library's own runtime leaves profiling off (it costs the host per launch); its
    profiled companion, made once on the same context, gives events with device times, and
    its unprofiled() leads back to the library's runtime."""
    import numpy as np
    import pyopencl.array as cla
    rt = clkernels.get_runtime(device.device)
    assert not rt.profiling and rt.unprofiled() is rt
    prof = rt.profiled()
    assert prof.profiling and prof is rt.profiled() and prof.unprofiled() is rt and prof.profiled() is prof
    assert prof.context == rt.context and prof.queue != rt.queue and prof.device == rt.device
    a = cla.to_device(rt.queue, np.arange(16, dtype=np.float32))     # made on the library's queue
    rt.queue.finish()
    out = clkernels.dcnv4(np.zeros((1, 3, 3, 8), np.float32), np.zeros((1, 3, 3, 32), np.float32),
                          group=1, group_channels=8, device=prof)
    assert out.shape == (1, 3, 3, 8)
    knl = cl.Kernel(cl.Program(prof.context, "__kernel void twice(__global float *a)"
                               " { a[get_global_id(0)] *= 2.0f; }").build(), "twice")
    event = knl(prof.queue, (16,), None, a.data)
    event.wait()
    assert event.profile.end >= event.profile.start > 0
    np.testing.assert_array_equal(a.get(), 2 * np.arange(16, dtype=np.float32))
    with pytest.raises(cl.RuntimeError):          # no timestamps on the library's queue
        knl(rt.queue, (16,), None, a.data).profile.start
    rt.queue.finish()
