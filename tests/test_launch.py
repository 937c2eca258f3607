"""The launch layer as users meet it: arrays on their own context and queue, ``out=``, the memory
pool over many calls, plans that make a repeat call render and build nothing, and device errors
that reach the caller. Results are checked against the independent references of each op's
own tests (numpy written from the definitions)."""
import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

import clkernels
import pyclad as pc
import solvers
from clkernels import launch, templates
from clkernels.dcnv4 import DCNv4Options

from test_dcnv4 import assert_close, call_opts, make_inputs, reference as dcnv4_reference
from test_deformable_aggregation import problem as da_problem, reference as da_reference

DCN = DCNv4Options(group=2, group_channels=4, offset_scale=0.5)


@pytest.fixture
def foreign(device):
    """A context and an in-order queue the library did not create, on the test's device."""
    ctx = cl.Context([device.device])
    return ctx, cl.CommandQueue(ctx)


def _on(queue, *arrays):
    return [cla.to_device(queue, a) for a in arrays]


@pytest.mark.oclgrind
def test_dcnv4_on_a_callers_context(device, foreign):
    ctx, queue = foreign
    x, om = make_inputs(DCN, 1, 4, 5, seed=3)
    go = np.random.default_rng(4).standard_normal((1, 4, 5, 8)).astype(np.float32)
    dx, dom, dgo = _on(queue, x, om, go)
    out = clkernels.dcnv4(dx, dom, **call_opts(DCN))      # no device=: where the arrays live
    assert isinstance(out, cla.Array) and out.context == ctx
    assert_close(out.get(), dcnv4_reference(x, om, DCN), 1e-5)
    g_in, g_om = clkernels.dcnv4_backward(dgo, dx, dom, **call_opts(DCN))
    assert g_in.context == ctx and g_om.context == ctx
    h_in, h_om = clkernels.dcnv4_backward(go, x, om, **call_opts(DCN), device=device)
    np.testing.assert_allclose(g_in.get(), h_in, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(g_om.get(), h_om)   # no atomics in the offset gradients


@pytest.mark.oclgrind
def test_deformable_aggregation_on_a_callers_context(device, foreign):
    ctx, queue = foreign
    feat, shape, start, loc, weights = da_problem(np.random.default_rng(5))
    dfeat, dloc, dw = _on(queue, feat, loc, weights)
    out = clkernels.deformable_aggregation(dfeat, shape, start, dloc, dw)
    assert out.context == ctx
    np.testing.assert_allclose(out.get(), da_reference(feat, shape, start, loc, weights),
                               rtol=1e-4, atol=1e-5)
    go = np.random.default_rng(6).standard_normal(out.shape).astype(np.float32)
    grads = clkernels.deformable_aggregation_backward(cla.to_device(queue, go), dfeat, shape, start, dloc, dw)
    host = clkernels.deformable_aggregation_backward(go, feat, shape, start, loc, weights, device=device)
    for g, h in zip(grads, host):
        assert g.context == ctx
        np.testing.assert_allclose(g.get(), h, rtol=1e-4, atol=1e-5)
    levels = [np.random.default_rng(7).standard_normal((1, 2, 4, 3, 5)).astype(np.float32)]
    packed, _, _ = clkernels.feature_maps_format(_on(queue, *levels))
    assert packed.context == ctx
    np.testing.assert_array_equal(packed.get(), clkernels.feature_maps_format(levels)[0])


def test_batch_function_on_a_callers_context(device, foreign):
    ctx, queue = foreign
    f = pc.BatchFunction(lambda a, b: [a[0] * b[0], pc.sin(a[1]) + b[0]], params=(2, 1))
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((5, 2)), rng.standard_normal((3, 1))
    index = np.array([[0, 0], [1, 2], [4, 1], [2, 2]], np.int32)
    if not device.info.fp64:
        pytest.skip("float64 BatchFunction needs fp64")
    out, (ja, jb) = f.values_and_jacobians(_on(queue, a, b), cla.to_device(queue, index))
    assert out.context == ctx and ja.context == ctx
    ia, ib = index[:, 0], index[:, 1]
    expected = np.stack([a[ia, 0] * b[ib, 0], np.sin(a[ia, 1]) + b[ib, 0]], axis=1)
    np.testing.assert_allclose(out.get(), expected, rtol=1e-12)
    np.testing.assert_allclose(ja.get()[:, 0, 0], b[ib, 0], rtol=1e-12)        # d(a0*b0)/da0
    np.testing.assert_allclose(ja.get()[:, 1, 1], np.cos(a[ia, 1]), rtol=1e-12)


def test_device_argument_on_another_context_is_an_error(device, foreign):
    ctx, queue = foreign
    x, om = _on(queue, *make_inputs(DCN, 1, 3, 3))
    with pytest.raises(ValueError, match="input lives on another OpenCL context"):
        clkernels.dcnv4(x, om, **call_opts(DCN), device=device)


@pytest.mark.oclgrind
def test_out_on_every_op(device):
    q = device.queue
    x, om = make_inputs(DCN, 1, 4, 4, seed=9)
    expected = dcnv4_reference(x, om, DCN)
    host_out = np.full(expected.shape, np.nan, np.float32)
    assert clkernels.dcnv4(x, om, **call_opts(DCN), out=host_out, device=device) is host_out
    assert_close(host_out, expected, 1e-5)
    dev_out = cla.empty(q, expected.shape, np.float32)
    assert clkernels.dcnv4(*_on(q, x, om), **call_opts(DCN), out=dev_out) is dev_out
    assert_close(dev_out.get(), expected, 1e-5)
    with pytest.raises(ValueError, match="out has shape"):
        clkernels.dcnv4(x, om, **call_opts(DCN), out=np.empty((1, 4, 4, 7), np.float32), device=device)
    with pytest.raises(TypeError, match="out must be a numpy array"):
        clkernels.dcnv4(x, om, **call_opts(DCN), out=dev_out, device=device)

    go = np.random.default_rng(10).standard_normal(expected.shape).astype(np.float32)
    want = clkernels.dcnv4_backward(go, x, om, **call_opts(DCN), device=device)
    g_om = np.empty_like(om)
    got = clkernels.dcnv4_backward(go, x, om, **call_opts(DCN), device=device, out=(None, g_om))
    assert got[1] is g_om
    np.testing.assert_array_equal(g_om, want[1])
    with pytest.raises(TypeError, match="tuple of 2"):
        clkernels.dcnv4_backward(go, x, om, **call_opts(DCN), device=device, out=g_om)

    feat, shape, start, loc, weights = da_problem(np.random.default_rng(11))
    ref = da_reference(feat, shape, start, loc, weights)
    da_out = cla.empty(q, ref.shape, np.float32)
    assert clkernels.deformable_aggregation(*_da_dev(q, feat, shape, start, loc, weights), out=da_out) is da_out
    np.testing.assert_allclose(da_out.get(), ref, rtol=1e-4, atol=1e-5)
    go = np.ones(ref.shape, np.float32)
    outs = tuple(np.empty(s, np.float32) for s in (feat.shape, loc.shape, weights.shape))
    got = clkernels.deformable_aggregation_backward(go, feat, shape, start, loc, weights, device=device, out=outs)
    assert all(g is o for g, o in zip(got, outs))
    want = clkernels.deformable_aggregation_backward(go, feat, shape, start, loc, weights, device=device)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)

    levels = [np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(1, 2, 3, 4, 5)]
    packed = np.empty((1, 2 * 20, 3), np.float32)
    assert clkernels.feature_maps_format(levels, out=packed)[0] is packed
    np.testing.assert_array_equal(packed, levels[0].reshape(1, 2, 3, 20).transpose(0, 1, 3, 2).reshape(1, 40, 3))
    dev_packed = cla.empty(q, packed.shape, np.float32)
    assert clkernels.feature_maps_format(_on(q, *levels), out=dev_packed)[0] is dev_packed
    np.testing.assert_array_equal(dev_packed.get(), packed)


def _da_dev(q, feat, shape, start, loc, weights):
    dfeat, dloc, dw = _on(q, feat, loc, weights)
    return dfeat, shape, start, dloc, dw


def test_memory_pool_does_not_grow_over_many_calls(device):
    q = device.queue
    x, om = _on(q, *make_inputs(DCN, 1, 6, 6))
    feat, shape, start, loc, weights = da_problem(np.random.default_rng(12))
    dfeat, dloc, dw = _on(q, feat, loc, weights)
    go = cla.to_device(q, np.ones((feat.shape[0], loc.shape[1], feat.shape[2]), np.float32))

    def calls():
        clkernels.dcnv4(x, om, **call_opts(DCN))
        clkernels.deformable_aggregation(dfeat, shape, start, dloc, dw)
        clkernels.deformable_aggregation_backward(go, dfeat, shape, start, dloc, dw)

    calls()
    q.finish()
    pool = device.pool
    before = pool.held_blocks + pool.active_blocks
    for _ in range(1000):
        calls()
    q.finish()
    assert pool.held_blocks + pool.active_blocks <= before + 2, \
        (before, pool.held_blocks, pool.active_blocks)


def test_a_repeat_call_renders_and_builds_nothing(device, monkeypatch):
    x, om = _on(device.queue, *make_inputs(DCN, 1, 5, 5))
    feat, shape, start, loc, weights = da_problem(np.random.default_rng(13))
    dev = _da_dev(device.queue, feat, shape, start, loc, weights)
    clkernels.dcnv4(x, om, **call_opts(DCN))
    clkernels.deformable_aggregation(*dev)

    def refuse(*a, **k):
        raise AssertionError("a repeat call rendered or built a program")
    for name in ("render", "build", "get_program"):
        monkeypatch.setattr(templates, name, refuse)
    monkeypatch.setattr(launch, "get_program", refuse)
    clkernels.dcnv4(x, om, **call_opts(DCN))
    clkernels.deformable_aggregation(*dev)


def test_a_mistyped_device_reaches_the_caller():
    problem = solvers.synthetic_problem(4, 12, seed=1)
    with pytest.raises(clkernels.DeviceNotFoundError, match="nvdia") as err:
        solvers.bundle_adjust(problem, backend="numpy", device="nvdia", verbose=False)
    for d in clkernels.list_devices():
        assert d.name.strip() in str(err.value)       # the message lists the devices found
    x, om = make_inputs(DCN, 1, 3, 3)
    with pytest.raises(clkernels.DeviceNotFoundError):
        clkernels.dcnv4(x, om, **call_opts(DCN), device="nvdia")
    with pytest.raises(clkernels.DeviceNotFoundError):
        pc.BatchFunction(lambda a: a[0] * 2, params=(1,), device="nvdia").values(
            [np.ones((2, 1))], np.zeros((2, 1), np.int32))


def test_out_of_order_queue_is_refused(device):
    props = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
    if not device.device.queue_properties & props:
        pytest.skip("this device offers no out-of-order queues")
    q = cl.CommandQueue(device.context, properties=props)
    x, om = make_inputs(DCN, 1, 3, 3)
    with pytest.raises(ValueError, match="out-of-order"):
        clkernels.dcnv4(x, om, **call_opts(DCN), queue=q)


SRC_TWO = """__kernel void add(__global float *a, const float v, const int n)
{ const int i = get_global_id(0); if (i < n) a[i] += v; }
__kernel void put(__global float *a, const float v) { a[get_global_id(0)] = v; }"""


def test_preset_sets_changed_arguments_and_gives_what_a_plain_launch_gives(device):
    """A Preset skips arguments equal to the last launch's, re-sets the changed ones (a new
    buffer, a new scalar), and computes what pyopencl's own call computes."""
    prg = templates.build(SRC_TWO, device)
    k = launch.Preset(cl.Kernel(prg, "add"))
    q = device.queue
    a, b = cla.zeros(q, 5, np.float32), cla.zeros(q, 5, np.float32)
    k(q, (5,), None, a.data, np.float32(1.0), np.int32(5))
    k(q, (5,), None, a.data, np.float32(1.0), np.int32(5))        # nothing re-set
    k(q, (5,), None, a.data, np.float32(2.5), np.int32(3))        # two scalars changed
    k(q, (5,), None, b.data, np.float32(2.5), np.int32(3))        # another buffer
    np.testing.assert_array_equal(a.get(), [4.5, 4.5, 4.5, 2.0, 2.0])
    np.testing.assert_array_equal(b.get(), [2.5, 2.5, 2.5, 0.0, 0.0])
    put, c = launch.Preset(cl.Kernel(prg, "put")), cla.zeros(q, 1, np.float32)
    put(q, (1,), None, c.data, np.float32(0.0))
    put(q, (1,), None, c.data, np.float32(-0.0))        # == 0.0, but other bits: set again
    assert np.signbit(c.get()[0])



def test_owned_kernels_are_reused_once_released_or_collected(device):
    import gc

    class Owner:
        pass

    prg = templates.build(SRC_TWO, device)
    first = Owner()
    k1 = launch.owned_kernel(prg, "add", first)
    second = Owner()
    assert launch.owned_kernel(prg, "add", second) is not k1        # still owned by first
    launch.release_kernels(first)
    third = Owner()
    assert launch.owned_kernel(prg, "add", third) is k1             # given back by hand
    launch.release_kernels(first)                                   # twice: nothing more
    del third
    gc.collect()
    assert launch.owned_kernel(prg, "add", Owner()) is k1           # given back when collected


def test_a_device_resident_solve_makes_no_kernel_object_the_last_one_made(device, monkeypatch):
    """Kernel objects go back to their pools at the end of a solve (the Minimizer closes its
    state), so a repeat solve makes none (each costs pyopencl ~0.15 ms to make)."""
    p = solvers.synthetic_problem(5, 40, 3, seed=3)
    kw = dict(device=device, max_iterations=2, handle_sigint=False, linear_solver="iterative_schur",
              dtype=np.float64 if device.info.fp64 else np.float32)
    assert solvers.bundle_adjust(p, **kw).state == "device"
    made = []
    real = cl.Kernel
    monkeypatch.setattr(cl, "Kernel", lambda *a: made.append(a[1]) or real(*a))
    solvers.bundle_adjust(p, **kw)
    assert made == []
