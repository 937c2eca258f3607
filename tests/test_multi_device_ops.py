"""``devices=`` on the vision ops (clkernels.multi_device): the batch shared among devices.

Here on one device (the list of one, errors); two real PoCL devices (``POCL_DEVICES="pthread
pthread"``, set before PoCL starts) in a subprocess."""
import textwrap

import numpy as np
import pyopencl.array as cla
import pytest

import clkernels
from clkernels.dcnv4 import DCNv4Options

from test_dcnv4 import call_opts, make_inputs
from test_deformable_aggregation import problem as da_problem
from pocl_pair import run_on_two_devices
DCN = DCNv4Options(group=2, group_channels=4)


def test_a_list_of_one_device_gives_that_devices_results(device):
    x, om = make_inputs(DCN, 3, 4, 5, seed=3)
    o = call_opts(DCN)
    assert np.array_equal(clkernels.dcnv4(x, om, **o, devices=[device]), clkernels.dcnv4(x, om, **o, device=device))
    feat, shape, start, loc, w = da_problem(np.random.default_rng(5), bs=3)
    assert np.array_equal(clkernels.deformable_aggregation(feat, shape, start, loc, w, devices=[device]),
                          clkernels.deformable_aggregation(feat, shape, start, loc, w, device=device))
    imgs = np.random.default_rng(0).integers(0, 256, (3, 30, 40, 3), dtype=np.uint8)
    blob, d2i = clkernels.letterbox(list(imgs), size=(16, 16), devices=[device])
    want_blob, want_d2i = clkernels.letterbox(imgs, size=(16, 16), device=device)
    assert np.array_equal(blob, want_blob) and np.array_equal(d2i, want_d2i)
    out = np.zeros_like(want_blob)
    assert clkernels.letterbox(imgs, size=(16, 16), devices=[device], out=out)[0] is out
    assert np.array_equal(out, want_blob)
    g_in, g_om = clkernels.dcnv4_backward(np.ones((3, 4, 5, 8), np.float32), x, om, **o, devices=[device],
                                          out=(None, np.zeros_like(om)))
    assert g_in.shape == x.shape and g_om.shape == om.shape


def test_devices_errors_name_the_fix(device):
    x, om = make_inputs(DCN, 2, 4, 5, seed=1)
    o = call_opts(DCN)
    with pytest.raises(ValueError, match="not both"):
        clkernels.dcnv4(x, om, **o, device=device, devices=[device])
    with pytest.raises(TypeError, match="host .numpy. arrays"):
        clkernels.dcnv4(cla.to_device(device.queue, x), cla.to_device(device.queue, om), **o, devices=[device])
    with pytest.raises(ValueError, match="batch"):
        clkernels.dcnv4(x, om[:1], **o, devices=[device])
    with pytest.raises(ValueError, match="leading axis"):
        clkernels.dcnv4(x, om, **o, devices=[device], out=np.zeros((3, 4, 5, 8), np.float32))
    with pytest.raises(ValueError, match="list of images"):
        clkernels.letterbox(np.zeros((30, 40, 3), np.uint8), devices=[device])


TWO_DEVICES = textwrap.dedent("""
    import json, sys, numpy as np, clkernels
    sys.path.insert(0, "tests")
    from clkernels.dcnv4 import DCNv4Options
    from test_dcnv4 import call_opts, make_inputs
    from test_deformable_aggregation import problem as da_problem
    one, two = pair
    out = {}
    o = call_opts(DCNv4Options(group=2, group_channels=8))
    x, om = make_inputs(DCNv4Options(group=2, group_channels=8), 5, 12, 10, seed=2)
    for k in range(2):       # equal shares, then from the measured throughputs
        out.setdefault("dcnv4", []).append(bool(np.array_equal(
            clkernels.dcnv4(x, om, **o, devices=pair), clkernels.dcnv4(x, om, **o, device=one))))
    go = np.random.default_rng(1).standard_normal((5, 12, 10, 16)).astype(np.float32)
    got = clkernels.dcnv4_backward(go, x, om, **o, devices=pair)
    want = clkernels.dcnv4_backward(go, x, om, **o, device=two)
    out["dcnv4_backward"] = [float(np.max(np.abs(g - w)) / np.max(np.abs(w))) for g, w in zip(got, want)]
    feat, shape, start, loc, w = da_problem(np.random.default_rng(3), bs=5)
    out["da"] = bool(np.array_equal(clkernels.deformable_aggregation(feat, shape, start, loc, w, devices="all"),
                                    clkernels.deformable_aggregation(feat, shape, start, loc, w, device=one)))
    g = np.random.default_rng(4).standard_normal((5,) + loc.shape[1:2] + feat.shape[2:]).astype(np.float32)
    got = clkernels.deformable_aggregation_backward(g, feat, shape, start, loc, w, devices=pair)
    want = clkernels.deformable_aggregation_backward(g, feat, shape, start, loc, w, device=one)
    out["da_backward"] = [float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30)) for a, b in zip(got, want)]
    imgs = np.random.default_rng(5).integers(0, 256, (7, 45, 61, 3), dtype=np.uint8)
    blob, d2i = clkernels.letterbox(list(imgs), size=(32, 24), devices=pair)
    want_blob, want_d2i = clkernels.letterbox(imgs, size=(32, 24), device=one)
    out["letterbox"] = bool(np.array_equal(blob, want_blob) and np.array_equal(d2i, want_d2i))
    print(json.dumps(out))
""")


def test_two_pocl_devices_share_the_batch():
    """On two PoCL devices: DCNv4, deformable aggregation and letterbox forward equal one
    device's bits (equal shares and measured shares; ``"all"`` finds both devices); the
    backward passes, which sum with atomics, agree to float rounding."""
    out = run_on_two_devices(TWO_DEVICES)
    assert out["dcnv4"] == [True, True]
    assert out["da"] and out["letterbox"]
    assert max(out["dcnv4_backward"]) < 1e-5 and max(out["da_backward"]) < 1e-5
