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
             N=1 at 200x320 and 100x160; group_channels 16/32/64; G=4), beside the official
             CUDA operator built and timed in the same run (CUDA events: ``official_events_ms``,
             ``vs_official`` = its time over ours), and an unfused PyTorch peer (grid_sample)
             at the as-called section's three shapes.
4. tuning:   work-group size and channels per work-item around the default, and the
             backward's configurations, at the paper's shape.
   loads:    (not in the default sections) how the work-items load, at the as-called
             shapes: DCNv4Config.prefetch and .interleave against the plain layout, forward
             (channels per work-item, vector width, work-group size) and deterministic
             backward (the default gather), kernel events; ``vs_plain``: the plain variant's
             time over this one's; the backward's ``steps_ms`` are its kernels' own times.
   tiles:    (not in the default sections) the forward with its output pixels taken in tiles
             (DCNv4Config.tile_rows x tile_cols) instead of rows, at the as-called shapes, for
             the default channels per work-item (and, with 16-bit storage, 8 and 32 beside a
             few tiles), work-groups of 128, 256 and 512, kernel events; ``vs_default``: the
             default configuration's time over this one's; ``same_bits``: the output's bits
             equal the default's (they must: a tile changes who computes a pixel, not how).
5. as-called: the forward as a caller sees it, ours against the official operator, at
             (N, H, W, C per group) = (64, 56, 56, 32), (64, 28, 28, 64), (1, 200, 320, 16), G=4,
             float32 and float16: ours = ``clkernels.dcnv4`` on pyopencl arrays, the official
             = ``DCNv4Function.apply`` of its own dcnv4_func.py (its d_stride/block_thread
             heuristic and table, im2col_step 256 as its module passes) on the same values
             as torch CUDA tensors. ``*_as_called_ms``: wall clock around one call and
             ``queue.finish()`` / ``torch.cuda.synchronize()`` (median of --calls after
             warm-up); ``*_pipelined_ms``: --pipeline calls back to back, one sync, divided;
             ``ours_kernel_ms`` (OpenCL events) and ``official_events_ms`` (CUDA events, the
             launches queued behind a short spin so the host's overhead is not counted).
             Ratios are official over ours (> 1: ours faster): ``as_called_ratio`` (as called
             vs as called), ``kernel_ratio`` (events vs events), ``events_vs_ours_as_called``
             (their kernel time over our as-called time), ``pipelined_ratio``.
             ``max_rel_diff``: the outputs' largest difference over the largest |official|.
             Then the backward at the same shapes: ours deterministic (the default) and with
             float atomics (``DCNv4Config(scatter="atomic")``), the official DCNv4Function.backward
             (float32, float16), timed alike. ``of_bound``: the bytes a call must move (forward:
             input, offset_mask, output; backward: input, offset_mask, grad_out, both
             gradients) over the 4.26 TB/s copy ceiling, divided by the as-called time.
             With --autotune (as ``PYCLAD_AUTOTUNE=1``), each forward shape's first call (a
             warm-up, untimed) measures its launch shapes (clkernels.autotune) and the timed
             calls use the fastest; ``autotune`` says which, against the default's kernel time.

Every section runs in float32 and float16, and in bfloat16 (``ml_dtypes.bfloat16``) where
ml_dtypes is installed; the official forward takes bfloat16 as well (its backward does not).

The official operator is built from sources staged by ``benchmarks/peers/stage_cuda_peers.sh``
into ``.peers/cuda`` (see ``benchmarks/cuda_peers.py``), only where torch sees a CUDA device
and the OpenCL device is a GPU; elsewhere its columns stay empty and the report says why.

Effective bandwidth counts input + offset_mask + output once (backward: + grad_out and both
gradients) against the 4.26 TB/s an OpenCL copy reaches on the H200.

    python benchmarks/bench_dcnv4.py [--quick] [--device SPEC] [--out DIR] [--sections LIST]
    python benchmarks/bench_dcnv4.py --as-called        # section 5 only

--quick (for CPUs): N=2 instead of 64 and fewer runs; the N=1 shapes stay.
"""
import dataclasses
import importlib
import sys

import numpy as np
import pyopencl.array as cla

import harness
import clkernels  # noqa: E402  (harness put the checkout on sys.path)
import cuda_peers  # noqa: E402

dcnv4_module = importlib.import_module("clkernels.dcnv4")
from clkernels import autotune  # noqa: E402
DCNv4Options, DCNv4Config, LADDER = dcnv4_module.DCNv4Options, dcnv4_module.DCNv4Config, dcnv4_module.LADDER

PAPER_MS = [1.45, 1.53, 1.51, 0.606]  # A100, float32 rungs; float16 vectorised: 0.404
PAPER_HALF_MS = 0.404
# (N, H, W, channels per group), G=4: the as-called comparison's shapes (N=64 becomes 2 under
# --quick); the torch grid_sample peer in `shapes` runs at these too.
AS_CALLED_SHAPES = ((64, 56, 56, 32), (64, 28, 28, 64), (1, 200, 320, 16))
SECTIONS = ("check", "ladder", "shapes", "tuning", "as-called")
EXTRA_SECTIONS = ("loads", "tiles")
# tiles: (rows, columns) of output pixels per tile; (0, 0) is the default, pixels in rows
TILES = ((0, 0), (2, 8), (4, 4), (2, 16), (4, 8), (8, 4), (4, 16), (8, 8), (16, 8), (8, 16))
try:                # bfloat16 rows where ml_dtypes is installed (the official forward takes it too)
    import ml_dtypes
    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:
    BF16 = None
DTYPES = (np.float32, np.float16) + ((BF16,) if BF16 is not None else ())
# Ours against a reference, relative to its largest magnitude: the storage's rounding of the
# result (2^-11 half, 2^-8 bfloat16) with room for the float sums before it.
TOLERANCE = {np.dtype(np.float32): 1e-5, np.dtype(np.float16): 2e-3}
if BF16 is not None:
    TOLERANCE[BF16] = 1.6e-2
COPY_CEILING = harness.H200_COPY_BYTES_PER_S


def make_problem(rt, n, h, w, g, c, dtype, seed=0):
    rng = np.random.default_rng(seed)
    p = dcnv4_module.offset_mask_channels(g)
    x = rng.standard_normal((n, h, w, g * c), dtype=np.float32).astype(dtype)
    om = rng.uniform(-1, 1, (n, h, w, p)).astype(dtype)
    return cla.to_device(rt.queue, x), cla.to_device(rt.queue, om)


def forward_bytes(x, om):
    return x.nbytes * 2 + om.nbytes  # input read, output written (same size), offsets read


# ---------------------------------------------------------------- independent torch peer

def torch_dcnv4(torch, x, om, o: DCNv4Options):
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
    o = DCNv4Options(kernel_h=3, kernel_w=3, stride_h=2, stride_w=1, pad_h=2, pad_w=1, dilation_h=2,
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
        tol = TOLERANCE[np.dtype(dtype)]
        variants = [(name, cfg) for name, cfg in LADDER] + [("device default", None)]
        for name, cfg in variants:
            out = dcnv4_module.dcnv4(xs, oms, **dataclasses.asdict(o), device=rt, config=cfg)
            err = harness.rel_err(out, ref)
            report.add(case="check forward", variant=name, dtype=np.dtype(dtype).name, rel_err=err)
            if not err < tol:
                failures.append(f"forward {name} {np.dtype(dtype).name}: {err:.2e}")
        for name, cfg in [("device default", None), ("atomic 1/work-item", DCNv4Config(1, 1, scatter="atomic")),
                          ("fixed 2/work-item", DCNv4Config(2, 2, scatter="fixed")),
                          ("atomic 4/work-item", DCNv4Config(4, 4, scatter="atomic")),
                          ("owner 8/work-item", DCNv4Config(8, 8, scatter="owner"))]:
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
    return harness.time_events(lambda: dcnv4_module.enqueue_forward(rt, x, om, o, cfg, out=out)[1],
                               warmup=args.warmup, repeat=args.repeat)


def time_backward(rt, args, x, om, o, cfg):
    return harness.time_events(lambda: dcnv4_module.enqueue_backward(rt, x, x, om, o, cfg)[1],
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
    o = DCNv4Options(group=4, group_channels=32)
    first = {}
    for dtype in DTYPES:
        x, om = make_problem(rt, n, 56, 56, 4, 32, dtype)
        for rung, (name, cfg) in enumerate(LADDER):
            t = time_forward(rt, args, x, om, o, cfg)
            first.setdefault(dtype, t.median)
            # Ratios to the float32 DCNv3-style rung, as the paper's 1.45 / 0.606 / 0.404.
            row = dict(case=f"ladder N={n} 56x56 G=4 C=32", variant=name, dtype=np.dtype(dtype).name,
                       timing=t, bytes_moved=forward_bytes(x, om), vs_first_rung=first[np.float32] / t.median)
            paper = PAPER_MS[rung] if dtype == np.float32 else \
                (PAPER_HALF_MS if rung == 3 and dtype == np.float16 else None)
            if paper:
                row.update(paper_ms=paper, paper_vs_first=PAPER_MS[0] / paper)
            report.add(**row)


def official_events(official, args, x, om, o):
    """The official operator's CUDA-event time on copies of x and om (seconds, median)."""
    tx, tom = cuda_peers.to_cuda(x), cuda_peers.to_cuda(om)
    official.check(tx, tom, o.kernel_h, o.kernel_w, o.remove_center)
    opts = dataclasses.asdict(o)
    return harness.Timing(cuda_peers.time_events(lambda: official.forward(tx, tom, **opts),
                                                 warmup=args.warmup, repeat=args.repeat))


def shapes(report, rt, args, quick, torch, tdev, official):
    n64 = 2 if quick else 64
    for (n, h, w) in [(n64, 56, 56), (n64, 28, 28), (n64, 14, 14), (n64, 7, 7), (1, 200, 320), (1, 100, 160)]:
        for c in (16, 32, 64):
            o = DCNv4Options(group=4, group_channels=c)
            for dtype in DTYPES:
                x, om = make_problem(rt, n, h, w, 4, c, dtype)
                t = time_forward(rt, args, x, om, o, None)
                row = dict(case=f"N={n} {h}x{w} G=4 C={c}", variant="default", dtype=np.dtype(dtype).name,
                           timing=t, bytes_moved=forward_bytes(x, om))
                if official is not None:
                    peer = official_events(official, args, x, om, o)
                    row.update(official_events_ms=peer.median * 1e3, vs_official=peer.median / t.median)
                if torch is not None and (n, h, w, c) in AS_CALLED_SHAPES and dtype == np.float32:
                    peer = time_peer(torch, tdev, args, x, om, o)
                    row.update(torch_peer_ms=peer.median * 1e3, vs_torch=peer.median / t.median)
                report.add(**row)


def tuning(report, rt, args, n):
    """Work-group size and channels per work-item around the default, forward, at the paper's
    shape and DCNv4's other as-called shapes; the backward's configurations at the paper's."""
    o = DCNv4Options(group=4, group_channels=32)
    shapes = [(n, 56, 56, 32), (n, 28, 28, 64), (1, 200, 320, 16)]
    for dtype in DTYPES:
        for N, H, W, C in shapes:
            oc = DCNv4Options(group=4, group_channels=C)
            xc, omc = make_problem(rt, N, H, W, 4, C, dtype)
            for cpw, vw in ((2, 2), (4, 4), (8, 4), (8, 8), (16, 8), (16, 16), (32, 8)):
                if C % cpw:
                    continue
                for wg in (32, 64, 128, 256, 512):
                    if wg > rt.info.max_work_group_size:
                        continue
                    try:
                        t = time_forward(rt, args, xc, omc, oc, DCNv4Config(cpw, vw, True, wg))
                    except ValueError as exc:  # more work-items than this variant's registers allow
                        print(f"  skipped cpw={cpw} vw={vw} wg={wg}: {exc}", flush=True)
                        continue
                    report.add(case=f"tune forward N={N} {H}x{W} G=4 C={C}", variant=f"cpw={cpw} vw={vw} wg={wg}",
                               dtype=np.dtype(dtype).name, timing=t, bytes_moved=forward_bytes(xc, omc))
        x, om = make_problem(rt, n, 56, 56, 4, 32, dtype)
        configs = [("default", None), ("owner cpw=8", DCNv4Config(8, 8, scatter="owner")),
                   ("atomic cpw=1", DCNv4Config(1, 1, scatter="atomic"))]
        if not rt.info.is_cpu:  # CAS atomics on a CPU: one is enough to show their cost
            configs += [("fixed cpw=1", DCNv4Config(1, 1, scatter="fixed")),
                        ("fixed cpw=2", DCNv4Config(2, 2, scatter="fixed")),
                        ("fixed cpw=4", DCNv4Config(4, 4, scatter="fixed")),
                        ("atomic cpw=2", DCNv4Config(2, 2, scatter="atomic")),
                        ("atomic cpw=4", DCNv4Config(4, 4, scatter="atomic")),
                        ("atomic cpw=8", DCNv4Config(8, 8, scatter="atomic"))]
        for name, cfg in configs:
            t = time_backward(rt, args, x, om, o, cfg)
            report.add(case=f"backward N={n} 56x56 G=4 C=32", variant=name, dtype=np.dtype(dtype).name,
                       timing=t, bytes_moved=2 * forward_bytes(x, om) + x.nbytes)


def as_called_problems(rt, n):
    """(case, options, dtype, x, offset_mask) at each as-called shape (N=64 becomes ``n``) and dtype."""
    for n_, h, w, c in AS_CALLED_SHAPES:
        n_ = n if n_ == 64 else n_
        o = DCNv4Options(group=4, group_channels=c)
        for dtype in DTYPES:
            yield f"N={n_} {h}x{w} G=4 C={c}", o, dtype, *make_problem(rt, n_, h, w, 4, c, dtype)


def loads(report, rt, args, n):
    """The loads section (see the docstring)."""
    for case, o, dtype, x, om in as_called_problems(rt, n):
        n_, c = x.shape[0], o.group_channels
        chunk = 16 // np.dtype(dtype).itemsize          # a 16-byte load
        plain = {}
        for cpw in (4, 8, 16):
            for vw in sorted({min(chunk, cpw), min(2 * chunk, cpw)}):
                for il, pf, wg in ((0, 0, 128), (0, 0, 256), (0, 1, 128), (0, 1, 256), (1, 0, 256),
                                   (1, 1, 128), (1, 1, 256)):
                    if c % cpw or cpw % vw or (il and (vw != chunk or cpw == vw or cpw == c)):
                        continue
                    cfg = DCNv4Config(cpw, vw, True, wg, interleave=bool(il), prefetch=bool(pf))
                    t = time_forward(rt, args, x, om, o, cfg)
                    base = plain.setdefault((cpw, vw, wg), t.median)
                    report.add(section="loads", case=f"forward {case}", dtype=np.dtype(dtype).name, timing=t,
                               variant=f"cpw={cpw} vw={vw} wg={wg} interleave={il} prefetch={pf}",
                               vs_plain=base / t.median, bytes_moved=forward_bytes(x, om))
        dflt = dcnv4_module.backward_config(rt.info, c, dtype, n_, 4)
        if dflt.scatter != "gather":
            continue        # prefetch and interleave are the scattering backward's
        chunk_cfg = dataclasses.replace(dflt, vector_width=chunk) if dflt.channels_per_item > chunk else None
        base = None
        for name, cfg in (("plain", dflt), ("prefetch", dataclasses.replace(dflt, prefetch=True)),
                          ("interleave", chunk_cfg and dataclasses.replace(chunk_cfg, interleave=True)),
                          ("interleave prefetch", chunk_cfg and dataclasses.replace(
                              chunk_cfg, interleave=True, prefetch=True))):
            if cfg is None:
                continue
            steps = []
            t = harness.time_events(lambda: _keep(steps, dcnv4_module.enqueue_backward(rt, x, x, om, o, cfg)[1]),
                                    warmup=args.warmup, repeat=args.repeat)
            base = base or t.median
            per_step = np.median(np.array(steps[-args.repeat:]), axis=0) * 1e3
            report.add(section="loads", case=f"backward {case}", dtype=np.dtype(dtype).name, timing=t,
                       variant=f"{name} cpw={cfg.channels_per_item} vw={cfg.vector_width}",
                       vs_plain=base / t.median, steps_ms=" ".join(f"{v:.4f}" for v in per_step),
                       bytes_moved=backward_bytes(x, om))


def tiles(report, rt, args, n):
    """The tiles section (see the docstring)."""
    for case, o, dtype, x, om in as_called_problems(rt, n):
        c = o.group_channels
        default = dcnv4_module.forward_config(rt.info, c, dtype, x.size // c, o.taps)
        out = cla.empty(rt.queue, (x.shape[0], *o.out_size(*x.shape[1:3]), x.shape[3]), x.dtype)
        base = time_forward(rt, args, x, om, o, None)
        reference = dcnv4_module.enqueue_forward(rt, x, om, o, default, out=out)[0].get()
        widths = [default.channels_per_item]
        if np.dtype(dtype).itemsize == 2:
            widths += [v for v in (8, 32) if c % v == 0 and v != default.channels_per_item]
        for cpw in widths:
            start = default if cpw == default.channels_per_item else \
                dataclasses.replace(default, channels_per_item=cpw, vector_width=8, interleave=False)
            for rows, cols in TILES if cpw == default.channels_per_item else ((0, 0), (4, 8), (8, 8)):
                for wg in (128, 256, 512):
                    cfg = dataclasses.replace(start, tile_rows=rows, tile_cols=cols, work_group_size=wg)
                    try:
                        t = time_forward(rt, args, x, om, o, cfg)
                    except ValueError as exc:   # more work-items than its registers allow
                        print(f"  skipped {cfg}: {exc}", flush=True)
                        continue
                    got = dcnv4_module.enqueue_forward(rt, x, om, o, cfg, out=out)[0].get()
                    report.add(section="tiles", case="forward " + case, dtype=np.dtype(dtype).name, timing=t,
                               variant=f"cpw={cpw} vw={cfg.vector_width} tile={rows}x{cols} wg={wg}",
                               vs_default=base.median / t.median, bytes_moved=forward_bytes(x, om),
                               same_bits=bool(np.array_equal(got.view(np.uint8), reference.view(np.uint8))))


def _keep(steps, events):
    """Record each event's own time once the last has run (a list of seconds), pass them on."""
    events[-1].wait()
    steps.append([(e.profile.end - e.profile.start) * 1e-9 for e in events])
    return events


def as_called(report, rt, args, official, failures):
    """Section 5: ours and the official forward as called from Python (see the docstring)."""
    n64 = 2 if args.quick else 64
    user = rt.unprofiled()      # the library's default runtime: what a caller's call runs on
    for n, h, w, c in AS_CALLED_SHAPES:
        n = n64 if n == 64 else n
        o = DCNv4Options(group=4, group_channels=c)
        opts = dataclasses.asdict(o)
        for dtype in DTYPES:
            x, om = make_problem(rt, n, h, w, 4, c, dtype)
            rt.queue.finish()   # x, om made on the profiling queue, called on the caller's
            call = lambda: clkernels.dcnv4(x, om, **opts, device=user)  # noqa: E731
            tuned = len(autotune.measured())
            ours = call().get()             # (with --autotune, this first call measures)
            mine = harness.Timing(cuda_peers.wall_as_called(call, user.queue.finish, args.warmup, args.calls))
            pipe = harness.Timing(cuda_peers.wall_pipelined(call, user.queue.finish, args.pipeline, args.warmup,
                                                            args.pipeline_repeat))
            kern = time_forward(rt, args, x, om, o, None)
            name = np.dtype(dtype).name
            row = dict(section="as called", case=f"N={n} {h}x{w} G=4 C={c}", variant="forward", dtype=name,
                       timing=mine, ours_as_called_ms=mine.median * 1e3, ours_pipelined_ms=pipe.median * 1e3,
                       ours_kernel_ms=kern.median * 1e3)
            if len(autotune.measured()) > tuned:
                row["autotune"] = tuned_choice(autotune.measured()[-1][2])
            if official is not None:
                tx, tom = cuda_peers.to_cuda(x), cuda_peers.to_cuda(om)
                official.check(tx, tom, o.kernel_h, o.kernel_w, o.remove_center)
                fn = lambda: official.forward(tx, tom, **opts)  # noqa: E731
                err = harness.rel_err(ours, cuda_peers.to_numpy(fn()))
                ev = cuda_peers.median(cuda_peers.time_events(fn, args.warmup, args.repeat))
                ac = cuda_peers.median(cuda_peers.time_as_called(fn, args.warmup, args.calls))
                pp = cuda_peers.median(cuda_peers.time_pipelined(fn, args.pipeline, args.warmup,
                                                                 args.pipeline_repeat))
                spec = official.spec(n, h, w, 4, c)
                row.update(official_as_called_ms=ac * 1e3, official_pipelined_ms=pp * 1e3,
                           official_events_ms=ev * 1e3, as_called_ratio=ac / mine.median,
                           kernel_ratio=ev / kern.median, events_vs_ours_as_called=ev / mine.median,
                           pipelined_ratio=pp / pipe.median, max_rel_diff=err,
                           official_spec="d_stride={} block_thread={}{}".format(
                               *spec["forward"], " (table)" if spec["from_table"] else ""))
                if not err < TOLERANCE[np.dtype(dtype)]:
                    failures.append(f"as called N={n} {h}x{w} C={c} {name}: ours vs official {err:.2e}")
                del tx, tom
            row["of_bound"] = forward_bytes(x, om) / COPY_CEILING / mine.median
            report.add(**row)
            as_called_backward(report, rt, args, official, failures, x, om, o, n, h, w, c)


def tuned_choice(times) -> str:
    """The choice autotune made, and its kernel time against the default's (the first measured)."""
    default, best = next(iter(times)), min(times, key=times.get)
    return (f"tile {best.tile_rows}x{best.tile_cols} wg {best.work_group_size or 'default'} "
            f"cpw {best.channels_per_item}: {times[default] / times[best]:.2f}x the default")


def backward_bytes(x, om):
    """input, offset_mask and grad_out read; both gradients written, once each."""
    return x.nbytes * 3 + om.nbytes * 2


def as_called_backward(report, rt, args, official, failures, x, om, o, n, h, w, c):
    """The backward as called, deterministic (the default) and with float atomics, beside the
    official backward (DCNv4Function.backward; float32 and float16, it has no bfloat16 one)."""
    opts = dataclasses.asdict(o)
    dtype = np.dtype(x.dtype)
    go = cla.to_device(rt.queue, np.random.default_rng(3).standard_normal(x.shape, np.float32).astype(dtype))
    user = rt.unprofiled()      # as in as_called
    results, official_call, reference = {}, None, None
    if official is not None and dtype != BF16:
        tx, tom, tgo = (cuda_peers.to_cuda(a) for a in (x, om, go))
        official_call = official.backward_call(tgo, tx, tom, **opts)
        reference = [cuda_peers.to_numpy(t) for t in official_call()]
    # Float atomics on GPUs only (CPUs sum them by compare-and-swap loops, which no caller gets
    # by default there), through their config: deterministic=False keeps the gather where it
    # runs (the faster), so the call names the scatter it compares.
    for deterministic in ((True, False) if not rt.info.is_cpu else (True,)):
        cfg = None if deterministic else dcnv4_module.float_atomics_config(c)
        call = lambda: clkernels.dcnv4_backward(go, x, om, **opts, device=user, config=cfg)  # noqa: E731
        ours = [a.get() for a in call()]
        results[deterministic] = ours
        mine = harness.Timing(cuda_peers.wall_as_called(call, user.queue.finish, args.warmup, args.calls))
        kern = harness.time_events(
            lambda: dcnv4_module.enqueue_backward(rt, go, x, om, o, config=cfg)[1],
            warmup=args.warmup, repeat=args.repeat)
        row = dict(section="as called", case=f"N={n} {h}x{w} G=4 C={c}", dtype=dtype.name,
                   variant="backward, " + ("deterministic" if deterministic else "float atomics"),
                   timing=mine, ours_as_called_ms=mine.median * 1e3, ours_kernel_ms=kern.median * 1e3,
                   of_bound=backward_bytes(x, om) / COPY_CEILING / mine.median)
        if official_call is not None:
            err = max(harness.rel_err(a, b) for a, b in zip(ours, reference))
            ev = cuda_peers.median(cuda_peers.time_events(official_call, args.warmup, args.repeat))
            ac = cuda_peers.median(cuda_peers.time_as_called(official_call, args.warmup, args.calls))
            row.update(official_as_called_ms=ac * 1e3, official_events_ms=ev * 1e3,
                       as_called_ratio=ac / mine.median, kernel_ratio=ev / kern.median, max_rel_diff=err)
            if not err < 10 * TOLERANCE[dtype]:
                failures.append(f"as called backward N={n} {h}x{w} C={c} {dtype.name}: ours vs official {err:.2e}")
        report.add(**row)
    # The deterministic gradients against the float-atomic ones: the same within float rounding.
    if False in results:
        err = max(harness.rel_err(a, b) for a, b in zip(results[True], results[False]))
        if not err < 10 * TOLERANCE[dtype]:
            failures.append(f"as called backward N={n} {h}x{w} C={c} {dtype.name}: deterministic vs atomics {err:.2e}")


AS_CALLED_COLUMNS = ["case", "variant", "dtype", "ours_as_called_ms", "ours_pipelined_ms", "ours_kernel_ms",
                     "official_as_called_ms", "official_pipelined_ms", "official_events_ms", "as_called_ratio",
                     "kernel_ratio", "events_vs_ours_as_called", "pipelined_ratio", "of_bound", "max_rel_diff",
                     "official_spec", "autotune", "spread"]


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated, of {', '.join(SECTIONS)} (default: all)")
    parser.add_argument("--as-called", action="store_true", help="only the as-called section")
    parser.add_argument("--calls", type=int, default=50, help="as-called: timed calls (median)")
    parser.add_argument("--pipeline", type=int, default=50, help="as-called: calls back to back per sample")
    parser.add_argument("--pipeline-repeat", type=int, default=5, help="as-called: pipelined samples")
    parser.add_argument("--peer-root", default=cuda_peers.DEFAULT_ROOT, help="staged official CUDA sources")
    parser.add_argument("--no-cuda-peer", action="store_true", help="do not build the official CUDA operator")
    parser.add_argument("--autotune", action="store_true",
                        help="as PYCLAD_AUTOTUNE=1: each forward shape's first call measures its launch shapes")
    args = parser.parse_args()
    if args.autotune:
        autotune.set_mode("tune")
    sections = ["as-called"] if args.as_called else [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS) - set(EXTRA_SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from "
                     f"{', '.join(SECTIONS + EXTRA_SECTIONS)}")
    if args.quick:
        args.repeat, args.warmup = min(args.repeat, 3), 1
        args.calls, args.pipeline, args.pipeline_repeat = min(args.calls, 10), min(args.pipeline, 10), 3
    name = "bench_dcnv4" if set(sections) == set(SECTIONS) else "bench_dcnv4-" + "-".join(sections)
    report = harness.Report(name, args, copy_ceiling_bytes_per_s=COPY_CEILING, sections=",".join(sections),
                            autotune=autotune.mode())
    rt = report.runtime
    report.meta["inline_ptx"] = dcnv4_module.used_ptx(rt)
    try:
        import torch
        tdev = "cuda" if not rt.info.is_cpu and torch.cuda.is_available() else "cpu"
        report.meta["torch_peer"] = f"torch {torch.__version__} on {tdev}"
    except ImportError:
        torch, tdev = None, None
        report.meta["torch_peer"] = "torch not installed: no check, no peer"
    official = None
    if "shapes" in sections or "as-called" in sections:
        # nvcc runs while the event-timed check and ladder sections do; nothing wall-clock
        # timed runs before the build is done
        pending = cuda_peers.load_in_background(
            "dcnv4", not (rt.info.is_cpu or rt.info.is_simulator), args.peer_root, args.no_cuda_peer)
    failures = check(report, rt, torch) if torch is not None and "check" in sections else []
    n = 2 if args.quick else 64
    if "ladder" in sections:
        ladder(report, rt, args, n)
    if "shapes" in sections or "as-called" in sections:
        official, reason = pending.result()
        report.meta["official_cuda"] = cuda_peers.describe(official) if official else f"unavailable: {reason}"
    if "shapes" in sections:
        shapes(report, rt, args, args.quick, torch, tdev, official)
    if "tuning" in sections:
        tuning(report, rt, args, n)
    if "loads" in sections:
        loads(report, rt, args, n)
    if "tiles" in sections:
        tiles(report, rt, args, n)
    if "as-called" in sections:
        as_called(report, rt, args, official, failures)
    report.meta["inline_ptx"] = dcnv4_module.used_ptx(rt)  # after every build
    for row in report.rows:
        if "GB_per_s" in row:
            row["of_copy_ceiling"] = row["GB_per_s"] * 1e9 / COPY_CEILING
    report.write(["case", "variant", "dtype", "median_s", "spread", "GB_per_s", "of_copy_ceiling",
                  "vs_first_rung", "paper_ms", "paper_vs_first", "official_events_ms", "vs_official",
                  "torch_peer_ms", "vs_torch", "rel_err"],
                 sections={"as called": AS_CALLED_COLUMNS,
                           "loads": ["case", "variant", "dtype", "median_s", "spread", "vs_plain", "GB_per_s",
                                     "of_copy_ceiling", "steps_ms"],
                           "tiles": ["case", "variant", "dtype", "median_s", "spread", "vs_default", "same_bits",
                                     "GB_per_s", "of_copy_ceiling"]})
    if any(row.get("same_bits") is False for row in report.rows):
        failures.append("tiles: a tiled forward's bits differ from the default's")
    if failures:
        print("CHECK FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
