"""clkernels.runtime.start_in_background: the driver started and the runtime made in a thread
(through clkernels.opencl_nogil, without the GIL), then used by the foreground; its failures.
Each case runs in a fresh process: the start happens once per process."""
import os
import subprocess
import sys
import textwrap

import pytest

import clkernels
from clkernels import opencl_nogil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code, **extra_env):
    env = {**{k: v for k, v in os.environ.items() if k != "PYCLAD_DEVICE"}, **extra_env}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=300)
    return out


def _spec(device):
    """A spec string that names ``device`` (a Runtime) in another process: platform:index."""
    devices = clkernels.list_devices()
    platforms = []
    for d in devices:
        if d.platform not in platforms:
            platforms.append(d.platform)
    same = [d for d in devices if d.platform == device.device.platform]
    return f"{platforms.index(device.device.platform)}:{same.index(device.device)}"


def test_the_loader_is_pyopencls_and_starts_every_device():
    assert opencl_nogil.loader_path() is not None
    assert opencl_nogil.start_drivers() >= len(clkernels.list_devices())


def test_the_foreground_gets_the_runtime_made_in_the_thread(device):
    """The context is the one made through ctypes, the callback saw the same runtime, and a
    kernel built and run on it gives the right answer."""
    spec = _spec(device)
    out = _run(f"""
        import numpy as np, pyopencl as cl, pyopencl.array as cla
        from clkernels import get_runtime, opencl_nogil, runtime
        made, seen = [], []
        create = opencl_nogil.create_context
        opencl_nogil.create_context = lambda ptr: made.append(create(ptr)) or made[-1]
        runtime.start_in_background({spec!r}, then=seen.append)
        rt = get_runtime({spec!r})
        assert made and made[0] is not None and rt.context.int_ptr == made[0], (made, rt.context.int_ptr)
        assert seen == [rt]
        prg = cl.Program(rt.context, "__kernel void twice(__global int *a) {{ a[get_global_id(0)] *= 2; }}").build()
        a = cla.to_device(rt.queue, np.arange(5, dtype=np.int32))
        prg.twice(rt.queue, (5,), None, a.data)
        assert a.get().tolist() == [0, 2, 4, 6, 8]
        runtime.start_in_background({spec!r})     # once per process: nothing more
        print("ok")
        """)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_a_device_that_is_not_there_is_reported_by_the_foreground():
    out = _run("""
        import clkernels
        from clkernels import runtime
        runtime.start_in_background("no-such-device-xyz")
        try:
            clkernels.get_runtime("no-such-device-xyz")
        except clkernels.DeviceNotFoundError as e:
            print("not found:", "no-such-device-xyz" in str(e))
        """)
    assert out.returncode == 0 and out.stdout.strip() == "not found: True", out.stderr


def test_an_unexpected_failure_is_raised_in_the_foreground():
    out = _run("""
        import clkernels
        from clkernels import runtime
        def then(rt):
            raise KeyError("in the callback")
        runtime.start_in_background(None, then=then)
        try:
            clkernels.get_runtime()
        except RuntimeError as e:
            print(type(e.__cause__).__name__, "background" in str(e))
        print(clkernels.get_runtime() is not None)      # raised once; the runtime stays usable
        """)
    assert out.returncode == 0 and out.stdout.split() == ["KeyError", "True", "True"], out.stderr


@pytest.mark.parametrize("code", ["import sys; sys.exit(3)", "raise SystemExit(3)"])
def test_an_early_exit_waits_for_the_thread(code):
    """A tool that ends before it uses the device (a bad input file) still ends cleanly."""
    out = _run(f"""
        from clkernels import runtime
        runtime.start_in_background()
        {code}
        """)
    assert out.returncode == 3 and not out.stderr, out.stderr


def test_the_callers_use_device_chooses_the_device():
    """The thread runs in the caller's context: a use_device() there picks the second of two
    PoCL devices, not the default first one, and the thread's context serves it."""
    out = _run("""
        import clkernels
        from clkernels import opencl_nogil, runtime
        pocl = [d for d in clkernels.list_devices() if clkernels.DeviceInfo.of(d).vendor == "pocl"]
        if len(pocl) < 2:
            print("fewer than two PoCL devices")
            raise SystemExit(0)
        made, seen = [], []
        create = opencl_nogil.create_context
        opencl_nogil.create_context = lambda ptr: made.append((ptr, create(ptr))) or made[-1][1]
        clkernels.use_device(pocl[1])
        runtime.start_in_background(then=seen.append)
        rt = clkernels.get_runtime()
        print(rt.device == pocl[1], seen == [rt], made[0][0] == pocl[1].int_ptr, rt.context.int_ptr == made[0][1])
        """, POCL_DEVICES="pthread pthread")
    assert out.returncode == 0 and out.stdout.split() == ["True"] * 4, (out.stdout, out.stderr)
