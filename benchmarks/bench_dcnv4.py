"""DCNv4 forward/backward: the paper's speed ablation and DCNv4's own benchmark shapes.

1. check:    every ablation rung, both dtypes, the backward paths, on a small problem with
             stride/dilation/remove_center/offset_scale, against an independent PyTorch
             implementation (grid_sample per tap, float64 on the CPU; autograd for the
             backward). A mismatch makes the script exit 1 after writing its results.
2. ladder:   the paper's Table 10 rungs (A100: DCNv3-style 1.45 ms, 8 channels per
             work-item 1.53, coefficients reused 1.51, vector loads/stores 0.606, float16
             0.404) on its shape, N=64 56x56, G=4 x 32 channels, offsets and masks uniform in
             [-1, 1]; every rung in float32 and float16; ratios to the first rung.
3. shapes:   the device's default kernel on DCNv4's benchmark shapes (N=64 at 56, 28, 14, 7;
             N=1 at 200x320 and 100x160; group_channels 16/32/64; G=4), with the official
             CUDA operator's H200 times where measured, and an unfused PyTorch peer
             (grid_sample) timed in the same run at those shapes.
4. tuning:   work-group size and channels per work-item around the default, and the
             backward's configurations, at the paper's shape.

Effective bandwidth counts input + offset_mask + output once (backward: + grad_out and both
gradients) against the 4.26 TB/s an OpenCL copy reaches on the H200.

    python benchmarks/bench_dcnv4.py [--quick] [--device SPEC] [--out DIR]

--quick (for CPUs): N=2 instead of 64 and fewer runs; the N=1 shapes stay.
"""
import dataclasses
import importlib
import sys

import numpy as np
import pyopencl.array as cla

import harness

dcnv4_module = importlib.import_module("clkernels.dcnv4")
Options, KernelConfig, LADDER = dcnv4_module.Options, dcnv4_module.KernelConfig, dcnv4_module.LADDER

PAPER_MS = [1.45, 1.53, 1.51, 0.606]  # A100, float32 rungs; float16 vectorised: 0.404
PAPER_HALF_MS = 0.404
# The official CUDA operator on the same H200, offsets and masks uniform in [-1, 1].
OFFICIAL_H200_MS = {(64, 56, 56, 32): (0.374, 0.237), (64, 28, 28, 64): (0.188, 0.128),
                    (1, 200, 320, 16): (0.091, 0.059)}
COPY_CEILING = harness.H200_COPY_BYTES_PER_S
DTYPES = (np.float32, np.float16)


def make_problem(rt, n, h, w, g, c, dtype, seed=0):
    rng = np.random.default_rng(seed)
    p = dcnv4_module.offset_mask_channels(g)
    x = rng.standard_normal((n, h, w, g * c), dtype=np.float32).astype(dtype)
    om = rng.uniform(-1, 1, (n, h, w, p)).astype(dtype)
    return cla.to_device(rt.queue, x), cla.to_device(rt.queue, om)


def forward_bytes(x, om):
    return x.nbytes * 2 + om.nbytes  # input read, output written (same size), offsets read


# ---------------------------------------------------------------- independent torch peer

def torch_dcnv4(torch, x, om, o: Options):
    """DCNv4 from torch ops: one grid_sample per tap (align_corners=True maps pixel centres,
    zeros outside: the operator's bilinear rule), masks multiplied, taps summed."""
    n, H, W, _ = x.shape
    G, C = o.group, o.group_channels
    ho, wo = o.out_size(H, W)
    taps = [(i, j) for i in range(o.kernel_w) for j in range(o.kernel_h)
            if not (o.remove_center and i == o.kernel_w // 2 and j == o.kernel_h // 2)]
    K = len(taps)
    hw_, hh_ = o.dilation_w * (o.kernel_w - 1) // 2, o.dilation_h * (o.kernel_h - 1) // 2
    blk = om[..., :G * K * 3].reshape(n, ho, wo, G, 3 * K)
    dx, dy, mask = blk[..., 0:2 * K:2], blk[..., 1:2 * K:2], blk[..., 2 * K:]
    kw = torch.tensor([i for i, _ in taps], dtype=x.dtype, device=x.device)
    kh = torch.tensor([j for _, j in taps], dtype=x.dtype, device=x.device)
    oy = torch.arange(ho, dtype=x.dtype, device=x.device).view(1, ho, 1, 1, 1)
    ox = torch.arange(wo, dtype=x.dtype, device=x.device).view(1, 1, wo, 1, 1)
    w = ox * o.stride_w - o.pad_w + hw_ + (kw * o.dilation_w - hw_ + dx) * o.offset_scale
    h = oy * o.stride_h - o.pad_h + hh_ + (kh * o.dilation_h - hh_ + dy) * o.offset_scale
    grid = torch.stack([w / (W - 1) * 2 - 1, h / (H - 1) * 2 - 1], dim=-1)  # n, ho, wo, G, K, 2
    grid = grid.permute(0, 3, 1, 2, 4, 5).reshape(n * G, ho, wo * K, 2)
    value = x.reshape(n, H, W, G, C).permute(0, 3, 4, 1, 2).reshape(n * G, C, H, W)
    sampled = torch.nn.functional.grid_sample(value, grid, mode="bilinear", padding_mode="zeros",
                                              align_corners=True).view(n * G, C, ho, wo, K)
    m = mask.permute(0, 3, 1, 2, 4).reshape(n * G, 1, ho, wo, K)
    out = (sampled * m).sum(-1).view(n, G, C, ho, wo)
    return out.permute(0, 3, 4, 1, 2).reshape(n, ho, wo, G * C)


def check(report, rt, torch):
    """Every kernel variant on a small awkward problem against the torch peer in float64."""
    o = Options(kernel_h=3, kernel_w=3, stride_h=2, stride_w=1, pad_h=2, pad_w=1, dilation_h=2,
                dilation_w=1, group=4, group_channels=16, offset_scale=0.5, remove_center=True)
    rng = np.random.default_rng(1)
    ho, wo = o.out_size(9, 11)
    x = rng.standard_normal((2, 9, 11, 64)).astype(np.float32)
    om = rng.uniform(-3, 3, (2, ho, wo, dcnv4_module.offset_mask_channels(4, 3, 3, True))).astype(np.float32)
    go = rng.standard_normal((2, ho, wo, 64)).astype(np.float32)
    failures = []
    for dtype in DTYPES:
        xs, oms, gos = (a.astype(dtype) for a in (x, om, go))
        tx, tom = (torch.tensor(a.astype(np.float64), requires_grad=True) for a in (xs, oms))
        ref = torch_dcnv4(torch, tx, tom, o)
        ref.backward(torch.tensor(gos.astype(np.float64)))
        ref = ref.detach().numpy()
        tol = 1e-5 if dtype == np.float32 else 2e-3
        variants = [(name, cfg) for name, cfg in LADDER] + [("device default", None)]
        for name, cfg in variants:
            out = dcnv4_module.dcnv4(xs, oms, **dataclasses.asdict(o), device=rt, config=cfg)
            err = harness.rel_err(out, ref)
            report.add(case="check forward", variant=name, dtype=np.dtype(dtype).name, rel_err=err)
            if not err < tol:
                failures.append(f"forward {name} {np.dtype(dtype).name}: {err:.2e}")
        for name, cfg in [("device default", None), ("atomic 1/work-item", KernelConfig(1, 1, scatter="atomic")),
                          ("atomic 4/work-item", KernelConfig(4, 4, scatter="atomic")),
                          ("owner 8/work-item", KernelConfig(8, 8, scatter="owner"))]:
            g_in, g_om = dcnv4_module.dcnv4_backward(gos, xs, oms, **dataclasses.asdict(o), device=rt,
                                                     config=cfg)
            errs = (harness.rel_err(g_in, tx.grad.numpy()), harness.rel_err(g_om, tom.grad.numpy()))
            report.add(case="check backward", variant=name, dtype=np.dtype(dtype).name,
                       rel_err=max(errs))
            if not max(errs) < 10 * tol:
                failures.append(f"backward {name} {np.dtype(dtype).name}: {errs}")
    return failures


# ---------------------------------------------------------------- timing

def time_forward(rt, args, x, om, o, cfg):
    out = cla.empty(rt.queue, (*x.shape[:1], *o.out_size(*x.shape[1:3]), x.shape[3]), x.dtype)
    return harness.time_events(lambda: dcnv4_module.launch_forward(rt, x, om, out, o, cfg),
                               warmup=args.warmup, repeat=args.repeat)


def time_backward(rt, args, x, om, o, cfg):
    return harness.time_events(lambda: dcnv4_module.launch_backward(rt, x, x, om, o, cfg)[2],
                               warmup=args.warmup, repeat=args.repeat)


def time_peer(torch, tdev, args, x, om, o):
    tx = torch.tensor(x.get().astype(np.float32), device=tdev)
    tom = torch.tensor(om.get().astype(np.float32), device=tdev)
    sync = torch.cuda.synchronize if tdev == "cuda" else (lambda: None)

    def run():
        with torch.no_grad():
            torch_dcnv4(torch, tx, tom, o)
        sync()
    return harness.time_wall(run, warmup=1, repeat=max(3, args.repeat // 2))


def ladder(report, rt, args, n):
    o = Options(group=4, group_channels=32)
    first = {}
    for dtype in DTYPES:
        x, om = make_problem(rt, n, 56, 56, 4, 32, dtype)
        for rung, (name, cfg) in enumerate(LADDER):
            t = time_forward(rt, args, x, om, o, cfg)
            first.setdefault(dtype, t.median)
            # Ratios to the float32 DCNv3-style rung, as the paper's 1.45 / 0.606 / 0.404.
            row = dict(case=f"ladder N={n} 56x56 G=4 C=32", variant=name, dtype=np.dtype(dtype).name,
                       timing=t, bytes_moved=forward_bytes(x, om), vs_first_rung=first[np.float32] / t.median)
            paper = PAPER_MS[rung] if dtype == np.float32 else (PAPER_HALF_MS if rung == 3 else None)
            if paper:
                row.update(paper_ms=paper, paper_vs_first=PAPER_MS[0] / paper)
            report.add(**row)


def shapes(report, rt, args, quick, torch, tdev):
    n64 = 2 if quick else 64
    for (n, h, w) in [(n64, 56, 56), (n64, 28, 28), (n64, 14, 14), (n64, 7, 7), (1, 200, 320), (1, 100, 160)]:
        for c in (16, 32, 64):
            o = Options(group=4, group_channels=c)
            official = OFFICIAL_H200_MS.get((n, h, w, c))
            for k, dtype in enumerate(DTYPES):
                x, om = make_problem(rt, n, h, w, 4, c, dtype)
                t = time_forward(rt, args, x, om, o, None)
                row = dict(case=f"N={n} {h}x{w} G=4 C={c}", variant="default", dtype=np.dtype(dtype).name,
                           timing=t, bytes_moved=forward_bytes(x, om))
                if official:
                    row.update(official_cuda_ms=official[k], vs_official=official[k] * 1e-3 / t.median)
                if torch is not None and official and dtype == np.float32:
                    peer = time_peer(torch, tdev, args, x, om, o)
                    row.update(torch_peer_ms=peer.median * 1e3, vs_torch=peer.median / t.median)
                report.add(**row)


def tuning(report, rt, args, n):
    o = Options(group=4, group_channels=32)
    for dtype in DTYPES:
        x, om = make_problem(rt, n, 56, 56, 4, 32, dtype)
        for cpw, vw in ((4, 4), (8, 8), (16, 8), (16, 16), (32, 8)):
            for wg in (64, 128, 256, 512):
                if wg > rt.info.max_work_group_size:
                    continue
                try:
                    t = time_forward(rt, args, x, om, o, KernelConfig(cpw, vw, True, wg))
                except ValueError as exc:  # more work-items than this variant's registers allow
                    print(f"  skipped cpw={cpw} vw={vw} wg={wg}: {exc}", flush=True)
                    continue
                report.add(case=f"tune forward N={n} 56x56 G=4 C=32", variant=f"cpw={cpw} vw={vw} wg={wg}",
                           dtype=np.dtype(dtype).name, timing=t, bytes_moved=forward_bytes(x, om))
        configs = [("default", None), ("owner cpw=8", KernelConfig(8, 8, scatter="owner")),
                   ("atomic cpw=1", KernelConfig(1, 1, scatter="atomic"))]
        if not rt.info.is_cpu:  # CAS atomics on a CPU: one is enough to show their cost
            configs += [("atomic cpw=2", KernelConfig(2, 2, scatter="atomic")),
                        ("atomic cpw=4", KernelConfig(4, 4, scatter="atomic")),
                        ("atomic cpw=8", KernelConfig(8, 8, scatter="atomic"))]
        for name, cfg in configs:
            t = time_backward(rt, args, x, om, o, cfg)
            report.add(case=f"backward N={n} 56x56 G=4 C=32", variant=name, dtype=np.dtype(dtype).name,
                       timing=t, bytes_moved=2 * forward_bytes(x, om) + x.nbytes)


def main():
    args = harness.parser(__doc__).parse_args()
    if args.quick:
        args.repeat, args.warmup = min(args.repeat, 3), 1
    report = harness.Report("bench_dcnv4", args, copy_ceiling_bytes_per_s=COPY_CEILING)
    rt = report.runtime
    report.meta["inline_ptx"] = dcnv4_module.used_ptx(rt)
    try:
        import torch
        tdev = "cuda" if not rt.info.is_cpu and torch.cuda.is_available() else "cpu"
        report.meta["torch_peer"] = f"torch {torch.__version__} on {tdev}"
    except ImportError:
        torch, tdev = None, None
        report.meta["torch_peer"] = "torch not installed: no check, no peer"
    failures = check(report, rt, torch) if torch is not None else []
    n = 2 if args.quick else 64
    ladder(report, rt, args, n)
    shapes(report, rt, args, args.quick, torch, tdev)
    tuning(report, rt, args, n)
    report.meta["inline_ptx"] = dcnv4_module.used_ptx(rt)  # after every build
    for row in report.rows:
        if "GB_per_s" in row:
            row["of_copy_ceiling"] = row["GB_per_s"] * 1e9 / COPY_CEILING
    report.write(["case", "variant", "dtype", "median_s", "spread", "GB_per_s", "of_copy_ceiling",
                  "vs_first_rung", "paper_ms", "paper_vs_first", "official_cuda_ms", "vs_official",
                  "torch_peer_ms", "vs_torch", "rel_err"])
    if failures:
        print("CHECK FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
