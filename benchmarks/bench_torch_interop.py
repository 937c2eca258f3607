"""PyTorch CUDA tensors through the OpenCL ops (clkernels.interop), against the official CUDA ops.

Sections (all on the GPU machine; the script says why and stops where torch has no CUDA device or
the GPU's OpenCL driver cannot share memory with CUDA):

- ``cost``: what the interop adds to a call. A small ``dcnv4`` (1 x 8 x 8 x 64) called on CUDA
  tensors (``torch_dcnv4``: the stream sync, acquire/release, the queue's wait, the outputs'
  tensors) against the same op on OpenCL device arrays already on the device (the op's own host
  cost and kernel, then the queue's finish): wall clock around the call, medians. The parts
  alone: an idle stream sync, acquire+release of one buffer, an idle queue finish, a tensor view.
  The same call with ``out=``: a pool tensor (``clkernels.torch.empty``), written in place, and a
  tensor of torch's allocator, which gets the result by one copy.
  The context hand-over: a small CUDA copy (synced), the OpenCL op (finished), and the two in
  turn; ``interop_us`` of the last row is what each hand-over of the GPU between PyTorch's CUDA
  context and the OpenCL driver's own context adds.
- ``steps``: one training step (forward, a loss, backward), wall clock around the step and
  ``torch.cuda.synchronize()``, medians after warm-up, ours and the official op's in the same
  process, the rest of the step the same torch code:
  - a small Sparse4D-like head: Linear -> weights (softmax over the samples), the deformable
    aggregation of 6 cameras x 4 scales (Sparse4D's shapes, 900 anchors, 13 points, 8 groups,
    256 channels), Linear; Sparse4D's op (HorizonRobotics/Sparse4D) as the peer;
  - a DCNv4 block: Linear (value), Linear (offsets and masks), ``dcnv4``, Linear (output),
    residual; the official op (OpenGVLab/DCNv4) as the peer.
  The peers are built in the run from ``.peers/cuda`` (``benchmarks/peers/stage_cuda_peers.sh``).

    python benchmarks/bench_torch_interop.py [--sections cost,steps] [--repeat 20]
"""
import importlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import cuda_peers  # noqa: E402

dcnv4_module = importlib.import_module("clkernels.dcnv4")
from clkernels.deformable_aggregation import deformable_aggregation_torch  # noqa: E402

MAPS = ((64, 176), (32, 88), (16, 44), (8, 22))
CAMS, POINTS, GROUPS, CHANNELS, ANCHORS = 6, 13, 8, 256, 900


def wall(fn, sync, warmup=5, repeat=20):
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - t)
    return harness.Timing(samples)


def cost(report, torch, bridge, repeat):
    import pyopencl.array as cla
    from clkernels import dcnv4
    opts = dict(group=4, group_channels=16)
    x = torch.randn(1, 8, 8, 64, device="cuda")
    om = torch.randn(1, 8, 8, 112, device="cuda") * 0.3
    sync = torch.cuda.synchronize
    t_torch = wall(lambda: dcnv4_module.torch_dcnv4(x, om, **opts), sync, repeat=repeat * 10)
    q = bridge.queue
    dx, dom = cla.to_device(q, x.cpu().numpy()), cla.to_device(q, om.cpu().numpy())
    t_cl = wall(lambda: dcnv4(dx, dom, **opts), q.finish, repeat=repeat * 10)
    report.add(case="dcnv4 1x8x8x64 forward", variant="CUDA tensors (torch_dcnv4)", timing=t_torch)
    report.add(case="dcnv4 1x8x8x64 forward", variant="OpenCL device arrays (dcnv4)", timing=t_cl,
               interop_us=round(1e6 * (t_torch.median - t_cl.median), 1))
    # out=: a pool tensor (clkernels.torch.empty) is written in place; a tensor of torch's own
    # allocator gets the result by one device-to-device copy.
    from clkernels.torch import empty
    pooled, plain = empty(x.shape, device="cuda"), torch.empty_like(x)
    with torch.no_grad():
        for variant, out in (("out= a pool tensor (clkernels.torch.empty)", pooled),
                             ("out= a torch tensor (one copy)", plain)):
            t_out = wall(lambda: dcnv4_module.torch_dcnv4(x, om, out=out, **opts), sync, repeat=repeat * 10)
            report.add(case="dcnv4 1x8x8x64 forward", variant=variant, timing=t_out,
                       interop_us=round(1e6 * (t_out.median - t_cl.median), 1))
    # The hand-over between the two APIs' contexts on one GPU: a small CUDA op (a copy, synced),
    # the OpenCL op alone (finished), and the two in turn, so each run hands the GPU from one
    # context to the other twice. What the pair costs above its parts is the GPU's switches.
    y = torch.empty_like(x)
    stream = torch.cuda.current_stream()
    cuda_op = lambda: (y.copy_(x), stream.synchronize())  # noqa: E731
    cl_op = lambda: (dcnv4(dx, dom, **opts), q.finish())  # noqa: E731
    t_cuda = wall(cuda_op, sync, repeat=repeat * 10)
    t_cl_alone = wall(cl_op, sync, repeat=repeat * 10)
    t_both = wall(lambda: (cuda_op(), cl_op()), sync, repeat=repeat * 10)
    report.add(case="context hand-over", variant="CUDA copy + stream sync", timing=t_cuda)
    report.add(case="context hand-over", variant="OpenCL dcnv4 + queue finish", timing=t_cl_alone)
    report.add(case="context hand-over", variant="the two in turn (two hand-overs)", timing=t_both,
               interop_us=round(1e6 * (t_both.median - t_cuda.median - t_cl_alone.median) / 2, 1))
    block = bridge.pool.allocate(4096)
    parts = {"idle stream sync": stream.synchronize,
             "acquire + release of one buffer": lambda: (bridge.acquire.acquire(q, [block.buffer]),
                                                        bridge.acquire.release(q, [block.buffer])),
             "idle queue finish": q.finish,
             "tensor view of a pool block": lambda: bridge.view(block, (1024,), torch.float32)}
    for name, fn in parts.items():
        report.add(case="interop parts", variant=name, timing=wall(fn, q.finish, repeat=repeat * 50))
    bridge.pool.give_back(block)


def sparse4d_head(torch, aggregate):
    """A step of: Linear -> softmax weights, aggregation, Linear, loss, backward."""
    nn = torch.nn
    sizes = [h * w for h, w in MAPS]
    dev = "cuda"
    feat = torch.randn(1, CAMS * sum(sizes), CHANNELS, device=dev, requires_grad=True)
    shape = torch.tensor([MAPS] * CAMS, dtype=torch.int32, device=dev)
    start = torch.tensor([[c * sum(sizes) + sum(sizes[:s]) for s in range(len(MAPS))] for c in range(CAMS)],
                         dtype=torch.int32, device=dev)
    loc = torch.rand(1, ANCHORS, POINTS, CAMS, 2, device=dev) * 1.2 - 0.1
    query = torch.randn(1, ANCHORS, CHANNELS, device=dev)
    to_weights = nn.Linear(CHANNELS, POINTS * CAMS * len(MAPS) * GROUPS).to(dev)
    out_proj = nn.Linear(CHANNELS, CHANNELS).to(dev)

    def step():
        w = to_weights(query).view(1, ANCHORS, POINTS * CAMS * len(MAPS), GROUPS).softmax(dim=2)
        w = w.reshape(1, ANCHORS, POINTS, CAMS, len(MAPS), GROUPS).contiguous()
        out = aggregate(feat, shape, start, loc, w)
        loss = out_proj(out).square().mean()
        loss.backward()
        return loss
    return step


def dcnv4_block(torch, conv, n=16, h=56, w=56, group=4, group_channels=32):
    nn = torch.nn
    c = group * group_channels
    p = -(-group * 27 // 8) * 8
    dev = "cuda"
    x = torch.randn(n, h, w, c, device=dev, requires_grad=True)
    value, offsets, out_proj = nn.Linear(c, c).to(dev), nn.Linear(c, p).to(dev), nn.Linear(c, c).to(dev)
    offsets.weight.data.mul_(0.1)

    def step():
        v = value(x).contiguous()
        om = offsets(x).contiguous()
        y = conv(v, om, group, group_channels)
        loss = (x + out_proj(y)).square().mean()
        loss.backward()
        return loss
    return step


def steps(report, torch, repeat, peer_root=None):
    sync = torch.cuda.synchronize
    da_peer, da_why = cuda_peers.load_for_benchmark("deformable_aggregation", True, peer_root)
    dc_peer, dc_why = cuda_peers.load_for_benchmark("dcnv4", True, peer_root)
    cases = [("Sparse4D-like head (900 anchors, 6 cams x 4 scales, 256 ch)", sparse4d_head,
              ("ours (deformable_aggregation_torch, CUDA tensors)", deformable_aggregation_torch),
              ("official (Sparse4D CUDA op)", da_peer.forward if da_peer else None, da_why)),
             ("DCNv4 block (16 x 56 x 56 x 128, group 4)", dcnv4_block,
              ("ours (torch_dcnv4, CUDA tensors)",
               lambda v, om, g, gc: dcnv4_module.torch_dcnv4(v, om, group=g, group_channels=gc)),
              ("official (DCNv4 CUDA op)",
               (lambda v, om, g, gc: dc_peer.forward(v, om, group=g, group_channels=gc)) if dc_peer else None,
               dc_why))]
    for case, make, (ours_label, ours), (peer_label, peer, why) in cases:
        t_ours = wall(make(torch, ours), sync, repeat=repeat)
        row = dict(case=case, variant=ours_label, timing=t_ours)
        if peer is None:
            report.add(**row, peer=f"unavailable: {why}")
            continue
        t_peer = wall(make(torch, peer), sync, repeat=repeat)
        report.add(case=case, variant=peer_label, timing=t_peer)
        report.add(**row, speedup_vs_official=round(t_peer.median / t_ours.median, 2))


def main():
    p = harness.parser(__doc__)
    p.add_argument("--sections", default="cost,steps")
    p.set_defaults(repeat=20)
    args = p.parse_args()
    try:
        import torch
    except ImportError as e:
        sys.exit(f"bench_torch_interop needs torch with CUDA: {e}")
    if not torch.cuda.is_available():
        sys.exit("bench_torch_interop needs a CUDA device (torch.cuda.is_available() is False)")
    from clkernels.interop.torch_cuda import bridge_for
    bridge = bridge_for(torch.device("cuda", 0))
    report = harness.Report("bench_torch_interop", args, opencl=f"{bridge.cl_device.name} "
                            f"({bridge.cl_device.platform.name})", torch=torch.__version__)
    sections = args.sections.split(",")
    if "cost" in sections:
        cost(report, torch, bridge, args.repeat)
    if "steps" in sections:
        steps(report, torch, args.repeat)
    report.write()


if __name__ == "__main__":
    main()
