"""Self-check of benchmarks/cuda_peers.py on a GPU machine: build both official CUDA peers from
.peers/cuda and run each once (forward and backward) on a small input; print the build times,
the official DCNv4 heuristic's choices, the outputs' shapes and a few timings. Exit status 1
if any step failed (each step's error is printed; the others still run).

    benchmarks/peers/stage_cuda_peers.sh                 # here, once
    TORCH_CUDA_ARCH_LIST=9.0 python3 benchmarks/peers/try_cuda_peers.py [--verbose]   # there
    python benchmarks/peers/try_cuda_peers.py --build-only   # no GPU: compile and import only
"""
import argparse
import concurrent.futures
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import cuda_peers as cp  # noqa: E402


def ms(samples):
    return f"{cp.median(samples) * 1e3:.4f} ms"


def try_dcnv4(torch, args, pending):
    peer = pending.result()
    print(f"dcnv4: built/loaded in {peer.build_s:.1f} s ({peer.source}); functions from "
          f"{peer.func.__file__}")
    for shape in ((64, 56, 56, 32), (64, 28, 28, 64), (1, 200, 320, 16), (2, 9, 11, 16)):
        n, h, w, c = shape
        print(f"  heuristic N={n} {h}x{w} G=4 C={c}: {peer.spec(n, h, w, 4, c)}")
    if args.build_only:
        return
    n, h, w, g, c = 2, 9, 11, 4, 16
    p = 112  # ceil(4 * 9 * 3 / 8) * 8
    for dtype in (torch.float32, torch.float16):
        x = torch.randn(n, h, w, g * c, device="cuda").to(dtype)
        om = (torch.rand(n, h, w, p, device="cuda") * 2 - 1).to(dtype)
        out = cp.official_dcnv4(x, om, 3, 3, 1, 1, 1, 1, 1, 1, g, c, 1.0, False)
        torch.cuda.synchronize()
        ok = bool(torch.isfinite(out).all())
        fn = lambda: peer.forward(x, om, group=g, group_channels=c)  # noqa: E731
        print(f"  forward {dtype}: out {tuple(out.shape)} {out.dtype} finite={ok} |out|max="
              f"{out.abs().max().item():.3g}; events {ms(cp.time_events(fn, repeat=5))}, as called "
              f"{ms(cp.time_as_called(fn, repeat=10))}, pipelined {ms(cp.time_pipelined(fn, k=10, repeat=3))}")
        go = torch.randn_like(out)
        bwd = peer.backward_call(go, x, om, group=g, group_channels=c)
        g_in, g_om = bwd()
        torch.cuda.synchronize()
        print(f"  backward {dtype}: grad_input {tuple(g_in.shape)} {g_in.dtype}, grad_offset_mask "
              f"{tuple(g_om.shape)}; events {ms(cp.time_events(bwd, repeat=5))}")
        # the official forward against torch's grid_sample on one output, float64
        ref = reference_dcnv4_point(torch, x.double(), om.double(), g, c, 0, 4, 5)
        err = (out[0, 4, 5].double() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)
        print(f"  forward {dtype}: output (0, 4, 5) vs a float64 direct sum: rel diff {err:.2e}")
        if err > (1e-5 if dtype == torch.float32 else 3e-3):
            raise AssertionError(f"official DCNv4 forward disagrees with the direct sum ({err:.2e})")


def reference_dcnv4_point(torch, x, om, g, c, b, y0, x0):
    """One output of DCNv4 (3x3, stride 1, pad 1, offset_scale 1, softmax off) as a direct sum,
    from the layout in clkernels.dcnv4's docstring."""
    H, W = x.shape[1:3]
    out = torch.zeros(g * c, dtype=torch.float64, device=x.device)
    taps = [(i, j) for i in range(3) for j in range(3)]
    for gi in range(g):
        blk = om[b, y0, x0, gi * 27:(gi + 1) * 27]
        for k, (i, j) in enumerate(taps):
            wx = x0 - 1 + 1 + (i - 1 + blk[2 * k].item())
            hy = y0 - 1 + 1 + (j - 1 + blk[2 * k + 1].item())
            m = blk[18 + k].item()
            if not (-1 < hy < H and -1 < wx < W):
                continue
            h0, w0 = int(torch.floor(torch.tensor(hy))), int(torch.floor(torch.tensor(wx)))
            for yy, xx in ((h0, w0), (h0, w0 + 1), (h0 + 1, w0), (h0 + 1, w0 + 1)):
                if 0 <= yy < H and 0 <= xx < W:
                    wgt = (1 - abs(hy - yy)) * (1 - abs(wx - xx))
                    out[gi * c:(gi + 1) * c] += m * wgt * x[b, yy, xx, gi * c:(gi + 1) * c]
    return out


def try_deformable_aggregation(torch, args, pending):
    peer = pending.result()
    print(f"deformable_aggregation: built/loaded in {peer.build_s:.1f} s ({peer.source}); "
          f"Function from {peer.func.__file__}")
    if args.build_only:
        return
    bs, anchors, pts, cams, groups, C = 1, 50, 13, 6, 8, 256
    maps = ((64, 176), (32, 88), (16, 44), (8, 22))
    sizes = [h * w for h, w in maps]
    shape = torch.tensor([maps] * cams, dtype=torch.int32, device="cuda")
    start = (torch.arange(cams)[:, None] * sum(sizes) +
             torch.cumsum(torch.tensor([0] + sizes[:-1]), 0)[None, :]).int().cuda()
    feat = torch.randn(bs, cams * sum(sizes), C, device="cuda")
    loc = torch.rand(bs, anchors, pts, cams, 2, device="cuda") * 1.2 - 0.1
    w = torch.rand(bs, anchors, pts, cams, len(maps), groups, device="cuda")
    out = cp.official_deformable_aggregation(feat, shape, start, loc, w)
    torch.cuda.synchronize()
    fn = lambda: peer.forward(feat, shape, start, loc, w)  # noqa: E731
    print(f"  forward: out {tuple(out.shape)} {out.dtype} finite={bool(torch.isfinite(out).all())}; events "
          f"{ms(cp.time_events(fn, repeat=5))}, as called {ms(cp.time_as_called(fn, repeat=10))}, "
          f"pipelined {ms(cp.time_pipelined(fn, k=10, repeat=3))}")
    go = torch.randn_like(out)
    grads = cp.official_deformable_aggregation_backward(go, feat, shape, start, loc, w)
    torch.cuda.synchronize()
    bwd = lambda: peer.backward(go, feat, shape, start, loc, w)  # noqa: E731
    print(f"  backward: grads {[tuple(g.shape) for g in grads]}; events {ms(cp.time_events(bwd, repeat=5))}, "
          f"as called {ms(cp.time_as_called(bwd, repeat=5))}")
    # autograd through the official Function must give the same gradients as the direct call
    leaves = [t.clone().requires_grad_() for t in (feat, loc, w)]
    auto = torch.autograd.grad(peer.forward(leaves[0], shape, start, leaves[1], leaves[2]), leaves, go)
    diff = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item() for a, b in zip(auto, grads))
    print(f"  backward via autograd vs direct: rel diff {diff:.2e}")
    if diff > 1e-4:
        raise AssertionError(f"direct backward disagrees with autograd ({diff:.2e})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=cp.DEFAULT_ROOT, help="staged sources (default .peers/cuda)")
    ap.add_argument("--verbose", action="store_true", help="show the compiler's commands")
    ap.add_argument("--build-only", action="store_true", help="no GPU needed: build and import only")
    ap.add_argument("--only", choices=("dcnv4", "deformable_aggregation"), help="one peer only")
    args = ap.parse_args()
    try:
        torch = cp._torch(require_device=not args.build_only)
    except cp.PeerUnavailable as exc:
        print(f"CUDA peers unavailable: {exc}")
        sys.exit(1)
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), "
          f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}, "
          f"TORCH_CUDA_ARCH_LIST={cp._arch_list(torch)}", flush=True)
    failed = []
    steps = [("dcnv4", try_dcnv4, cp.load_dcnv4),
             ("deformable_aggregation", try_deformable_aggregation, cp.load_deformable_aggregation)]
    steps = [s for s in steps if not args.only or s[0] == args.only]
    # both builds at once (one nvcc each); each step waits for its own
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(steps))
    pending = {name: pool.submit(load, args.root, verbose=args.verbose, require_device=not args.build_only)
               for name, _, load in steps}
    for name, step, _ in steps:
        try:
            step(torch, args, pending[name])
        except Exception as exc:  # report and go on to the next peer
            traceback.print_exc()
            failed.append(f"{name}: {exc}"[:2000])
        sys.stdout.flush()
    if failed:
        print("FAILED:\n  " + "\n  ".join(failed))
        sys.exit(1)
    print("all peers OK")


if __name__ == "__main__":
    main()
