"""The official CUDA operators, built in the benchmark's own run, as peers of our OpenCL ops.

- DCNv4 (OpenGVLab/DCNv4): only ``dcnv4_cuda.cu`` is compiled, with our binding
  ``benchmarks/peers/dcnv4_binding.cpp`` (the official extension also builds flash
  deformable attention, minutes of nvcc we do not need). It is called through the official
  ``functions/dcnv4_func.py`` itself, imported at run time with its ``from DCNv4 import ext``
  pointed at our build, so the launch heuristic (``findspec`` / ``find_spec_bwd`` and their
  ``TABLE`` of d_stride and block_thread per shape) is the official one, not a copy.
- Sparse4D's deformable aggregation (HorizonRobotics/Sparse4D): its own ``.cpp`` binding and
  ``.cu`` kernels as published, called through its own ``DeformableAggregationFunction``
  (``ops/deformable_aggregation.py``), which converts the inputs and zero-allocates the
  backward's gradient buffers on every call.

The sources are not part of this project: ``benchmarks/peers/stage_cuda_peers.sh`` extracts
them from the public repositories into the git-ignored ``.peers/cuda``; this module reads
them from there. Builds land in ``.peers/cuda/build/<name>`` (ninja rebuilds only what
changed). ``TORCH_CUDA_ARCH_LIST`` defaults to the visible GPU's compute capability (9.0 on
an H200; 9.0 when no GPU is visible) so that one architecture is compiled.

Anything missing (torch, a CUDA device, nvcc, the staged sources, a build) raises
:class:`PeerUnavailable` with the reason; the benchmarks print it, leave the peer columns
empty and write the reason into the report.

Timers for a CUDA callable (seconds; lists of samples, take the median):
:func:`time_events` (CUDA events around the op on the current stream: the device's time),
:func:`time_as_called` (wall clock around one call and ``torch.cuda.synchronize()``),
:func:`time_pipelined` (K calls back to back, one synchronize, divided by K).

    python benchmarks/peers/try_cuda_peers.py     # builds both, runs each once
"""
from __future__ import annotations

import glob
import importlib
import os
import shutil
import statistics
import sys
import time
import types
import warnings
from typing import Callable, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_ROOT = os.path.join(REPO, ".peers", "cuda")
BINDING_DIR = os.path.join(HERE, "peers")
STAGE_HINT = ("run benchmarks/peers/stage_cuda_peers.sh here, and carry '.peers/cuda' to the GPU "
              "machine")
# nvcc flags of the official setup.py files (DCNv4_op/setup.py; Sparse4D's ops/setup.py has the
# same three half-precision switches and no -O3, which nvcc's device code gets by default).
DCNV4_NVCC = ["-DCUDA_HAS_FP16=1", "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
              "-D__CUDA_NO_HALF2_OPERATORS__", "-O3", "-DWITH_CUDA"]
SPARSE4D_NVCC = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                 "-D__CUDA_NO_HALF2_OPERATORS__", "-O3", "-DWITH_CUDA"]
DCNV4_IM2COL_STEP = 256  # what the official DCNv4 module passes to DCNv4Function


class PeerUnavailable(RuntimeError):
    """The CUDA peer cannot be used here; the message says why."""


_LOADED: dict = {}  # (kind, root) -> peer


# ---------------------------------------------------------------- environment and build

def _torch(require_device: bool = True):
    try:
        import torch
    except ImportError as exc:
        raise PeerUnavailable(f"torch is not installed ({exc})") from exc
    if require_device and not torch.cuda.is_available():
        raise PeerUnavailable(f"torch {torch.__version__} sees no CUDA device")
    _cuda_home()
    return torch


def _is_toolkit(home: Optional[str]) -> bool:
    return bool(home) and all(os.path.exists(os.path.join(home, *p)) for p in
                              (("bin", "nvcc"), ("include", "cuda_runtime.h")))


def _cuda_home() -> str:
    """The CUDA toolkit torch builds with. torch takes the folder above the first nvcc on the
    PATH when CUDA_HOME is unset, which is wrong where that nvcc is a wrapper script (as in
    /usr/local/bin here); then the usual install folders are tried and torch is pointed there."""
    from torch.utils import cpp_extension
    home = cpp_extension.CUDA_HOME
    if not _is_toolkit(home):
        candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda",
                      *sorted(glob.glob("/usr/local/cuda-*"), reverse=True)]
        found = next((c for c in candidates if _is_toolkit(c)), None)
        if found is None:
            raise PeerUnavailable(f"no CUDA toolkit (nvcc and its headers): torch's CUDA_HOME={home!r}, nvcc on "
                                  f"PATH: {shutil.which('nvcc')!r} (the official ops are built in the run)")
        home = cpp_extension.CUDA_HOME = os.environ["CUDA_HOME"] = found
    return home


def _library_headers() -> List[str]:
    """torch's CUDA headers include the CUDA libraries' (cusparse.h, cublas_v2.h); a toolkit
    without them gets those of the pip wheels torch runs on (nvidia/*/include)."""
    if os.path.exists(os.path.join(_cuda_home(), "include", "cusparse.h")):
        return []
    for path in sys.path:
        hits = sorted(glob.glob(os.path.join(path, "nvidia", "*", "include", "cusparse.h")))
        if hits:
            return [os.path.dirname(hits[-1])]
    return []


def _staged(root: str, *parts: str) -> str:
    path = os.path.join(root, *parts)
    if not os.path.exists(path):
        raise PeerUnavailable(f"{path} is missing: {STAGE_HINT}")
    return path


def _source_line(root: str, name: str) -> str:
    try:
        with open(os.path.join(root, "SOURCES.txt")) as f:
            return next((line.split(None, 1)[1].strip() for line in f if line.startswith(name + " ")), "?")
    except OSError:
        return "?"


def _arch_list(torch) -> str:
    if not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"  # the H200 the benchmarks are for
    return os.environ["TORCH_CUDA_ARCH_LIST"]


def _thc_shim(torch, root: str) -> List[str]:
    """Both official .cu files include <THC/THCAtomics.cuh>, a header newer torch releases may
    drop (they only use CUDA's own float atomicAdd). If this torch lacks it, an include folder
    with a one-line stand-in that includes ATen's atomics."""
    from torch.utils.cpp_extension import include_paths
    if any(os.path.exists(os.path.join(p, "THC", "THCAtomics.cuh")) for p in include_paths()):
        return []
    shim = os.path.join(root, "build", "thc_shim")
    os.makedirs(os.path.join(shim, "THC"), exist_ok=True)
    with open(os.path.join(shim, "THC", "THCAtomics.cuh"), "w") as f:
        f.write("#pragma once\n#include <ATen/cuda/Atomic.cuh>\n")
    return [shim]


def _build(torch, root: str, name: str, sources: List[str], includes: List[str], nvcc_flags: List[str],
           verbose: bool):
    from torch.utils.cpp_extension import load
    build_dir = os.path.join(root, "build", name)
    os.makedirs(build_dir, exist_ok=True)
    arch = _arch_list(torch)
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # compiler-version chatter
            module = load(name=name, sources=sources,
                          extra_include_paths=includes + _thc_shim(torch, root) + _library_headers(),
                          extra_cflags=["-O3", "-DWITH_CUDA"], extra_cuda_cflags=nvcc_flags,
                          build_directory=build_dir, verbose=verbose)
    except Exception as exc:  # the compiler's output is in the message
        raise PeerUnavailable(f"building {name} (TORCH_CUDA_ARCH_LIST={arch}) failed: {exc}") from exc
    return module, time.perf_counter() - t0


def _import_official(package: str, folder: str, module: str, fakes: dict):
    """Import ``folder/module.py`` as ``package.module`` (so its relative imports resolve beside
    it) without running any package __init__, with ``fakes`` in sys.modules during the import
    (its absolute imports of the official extension then get our build)."""
    for name in [k for k in sys.modules if k == package or k.startswith(package + ".")]:
        del sys.modules[name]  # a load from another root imports afresh
    pkg = types.ModuleType(package)
    pkg.__path__ = [folder]
    saved = {k: sys.modules.get(k) for k in fakes}
    sys.modules[package] = pkg
    sys.modules.update(fakes)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.cuda.amp.custom_fwd is deprecated
            return importlib.import_module(f"{package}.{module}")
    except Exception as exc:
        raise PeerUnavailable(f"importing the official {folder}/{module}.py failed: {exc!r}") from exc
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


class _Ctx:
    """Stands in for autograd's ctx when an official Function's forward/backward is called
    directly (so a backward can be timed without re-running the forward)."""

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors


# ---------------------------------------------------------------- DCNv4

class DCNv4Peer:
    """The official DCNv4 op: ``forward`` is ``DCNv4Function.apply`` of the official
    dcnv4_func.py (its launch heuristic inside), on CUDA tensors laid out as ours: input
    [N, H, W, G*C], offset_mask [N, Ho, Wo, P] with P a multiple of 8; softmax off."""

    def __init__(self, torch, ext, func, build_s: float, source: str):
        self.torch, self.ext, self.func, self.build_s, self.source = torch, ext, func, build_s, source
        self.function = func.DCNv4Function

    def forward(self, input, offset_mask, kernel_h=3, kernel_w=3, stride_h=1, stride_w=1, pad_h=1,
                pad_w=1, dilation_h=1, dilation_w=1, group=4, group_channels=32, offset_scale=1.0,
                remove_center=False, im2col_step=DCNV4_IM2COL_STEP):
        return self.function.apply(input, offset_mask, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w,
                                   dilation_h, dilation_w, group, group_channels, float(offset_scale),
                                   im2col_step, int(remove_center))

    def backward_call(self, grad_out, input, offset_mask, **options) -> Callable:
        """A callable that runs the official backward (DCNv4Function.backward, with the
        backward heuristic's d_stride/block_thread) and returns (grad_input, grad_offset_mask);
        the forward runs once here, untimed, to fill the context as autograd would."""
        args = self._args(**options)
        ctx = _Ctx()
        self.function.forward(ctx, input, offset_mask, *args)
        grad_out = grad_out.contiguous()
        return lambda: self.function.backward(ctx, grad_out)[:2]

    @staticmethod
    def _args(kernel_h=3, kernel_w=3, stride_h=1, stride_w=1, pad_h=1, pad_w=1, dilation_h=1,
              dilation_w=1, group=4, group_channels=32, offset_scale=1.0, remove_center=False,
              im2col_step=DCNV4_IM2COL_STEP):
        return (kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, group,
                group_channels, float(offset_scale), im2col_step, int(remove_center))

    def spec(self, n, h, w, group, group_channels) -> dict:
        """The official heuristic's choice for an input [n, h, w, group*group_channels];
        ``from_table``: the forward's came from its TABLE (not its fallback formula)."""
        from_table = f"{n}x{h}x{w}x{group}x{group_channels}" in self.func.TABLE  # findspec adds misses
        return {"forward": tuple(self.func.findspec(n, h, w, group, group_channels)),
                "backward": tuple(self.func.find_spec_bwd(n, h, w, group, group_channels)),
                "from_table": from_table}

    def check(self, input, offset_mask, kernel_h, kernel_w, remove_center, im2col_step=DCNV4_IM2COL_STEP):
        """The official kernel's limits, which it does not all check itself."""
        k = kernel_h * kernel_w - int(bool(remove_center))
        if k not in (8, 9):
            raise ValueError(f"the official DCNv4 kernel handles 3x3 kernels only (K = 9, or 8 with "
                             f"remove_center), got K = {k}")
        if offset_mask.shape[-1] % 8:
            raise ValueError(f"offset_mask's last axis ({offset_mask.shape[-1]}) must be padded to a "
                             "multiple of 8 for the official kernel")
        n = input.shape[0]
        if n % min(n, im2col_step):
            raise ValueError(f"batch {n} is not a multiple of min(batch, im2col_step={im2col_step})")
        if not (input.is_cuda and offset_mask.is_cuda and input.is_contiguous() and offset_mask.is_contiguous()):
            raise ValueError("the official DCNv4 op takes contiguous CUDA tensors")


def load_dcnv4(root: Optional[str] = None, verbose: bool = False, require_device: bool = True) -> DCNv4Peer:
    """Build dcnv4_cuda.cu with our binding and import the official dcnv4_func.py against it
    (once per root and process)."""
    root = os.path.abspath(root or DEFAULT_ROOT)
    if ("dcnv4", root) in _LOADED:
        return _LOADED["dcnv4", root]
    torch = _torch(require_device)
    src = _staged(root, "DCNv4", "src")
    cu = _staged(root, "DCNv4", "src", "cuda", "dcnv4_cuda.cu")
    _staged(root, "DCNv4", "src", "cuda", "dcnv4_cuda.h")
    functions = os.path.dirname(_staged(root, "DCNv4", "DCNv4", "functions", "dcnv4_func.py"))
    _staged(root, "DCNv4", "DCNv4", "functions", "table.py")
    ext, build_s = _build(torch, root, "pyclad_peer_dcnv4", [os.path.join(BINDING_DIR, "dcnv4_binding.cpp"), cu],
                          [src], DCNV4_NVCC, verbose)
    fake = types.ModuleType("DCNv4")  # dcnv4_func.py does `from DCNv4 import ext`
    fake.__path__ = []
    fake.ext = ext
    func = _import_official("_pyclad_peer_dcnv4", functions, "dcnv4_func", {"DCNv4": fake, "DCNv4.ext": ext})
    _LOADED["dcnv4", root] = DCNv4Peer(torch, ext, func, build_s, _source_line(root, "DCNv4"))
    return _LOADED["dcnv4", root]


# ---------------------------------------------------------------- Sparse4D deformable aggregation

class DeformableAggregationPeer:
    """Sparse4D's op through its own DeformableAggregationFunction, float32 CUDA tensors in
    our layout (the same argument order as clkernels.deformable_aggregation)."""

    def __init__(self, torch, ext, func, build_s: float, source: str):
        self.torch, self.ext, self.func, self.build_s, self.source = torch, ext, func, build_s, source
        self.function = func.DeformableAggregationFunction

    def forward(self, mc_ms_feat, spatial_shape, scale_start_index, sampling_location, weights):
        return self.function.apply(mc_ms_feat, spatial_shape, scale_start_index, sampling_location, weights)

    def backward(self, grad_out, mc_ms_feat, spatial_shape, scale_start_index, sampling_location, weights):
        """(grad_mc_ms_feat, grad_sampling_location, grad_weights) from the official backward,
        which zero-allocates the three gradient tensors and calls the extension's
        deformable_aggregation_backward on them; ctx holds what its forward would save."""
        ctx = _Ctx()
        ctx.saved_tensors = (mc_ms_feat, spatial_shape, scale_start_index, sampling_location, weights)
        g = self.function.backward(ctx, grad_out)
        return g[0], g[3], g[4]


def load_deformable_aggregation(root: Optional[str] = None, verbose: bool = False,
                                require_device: bool = True) -> DeformableAggregationPeer:
    """Build Sparse4D's extension (its .cpp binding and .cu, as published) and import its
    deformable_aggregation.py against it (once per root and process)."""
    root = os.path.abspath(root or DEFAULT_ROOT)
    if ("deformable_aggregation", root) in _LOADED:
        return _LOADED["deformable_aggregation", root]
    torch = _torch(require_device)
    ops = _staged(root, "Sparse4D", "ops")
    src = _staged(root, "Sparse4D", "ops", "src")
    sources = sorted(os.path.join(src, f) for f in os.listdir(src) if f.endswith((".cpp", ".cu")))
    if not any(s.endswith(".cu") for s in sources):
        raise PeerUnavailable(f"no .cu file in {src}: {STAGE_HINT}")
    _staged(root, "Sparse4D", "ops", "deformable_aggregation.py")
    ext, build_s = _build(torch, root, "pyclad_peer_deformable_aggregation", sources, [src], SPARSE4D_NVCC, verbose)
    package = "_pyclad_peer_sparse4d"  # the Function does `from . import deformable_aggregation_ext`
    func = _import_official(package, ops, "deformable_aggregation", {f"{package}.deformable_aggregation_ext": ext})
    _LOADED["deformable_aggregation", root] = DeformableAggregationPeer(torch, ext, func, build_s,
                                                                         _source_line(root, "Sparse4D"))
    return _LOADED["deformable_aggregation", root]


# ---------------------------------------------------------------- module-level calls

def _peer(kind: str):
    return {"dcnv4": load_dcnv4, "deformable_aggregation": load_deformable_aggregation}[kind]()


def official_dcnv4(input, offset_mask, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h,
                   dilation_w, group, group_channels, offset_scale, remove_center):
    """The official DCNv4 forward (softmax off) on CUDA tensors, as clkernels.dcnv4 takes them.
    Loads the peer from .peers/cuda on first use; checks the official kernel's limits."""
    peer = _peer("dcnv4")
    peer.check(input, offset_mask, kernel_h, kernel_w, remove_center)
    return peer.forward(input, offset_mask, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h,
                        dilation_w, group, group_channels, offset_scale, remove_center)


def official_deformable_aggregation(mc_ms_feat, spatial_shape, scale_start_index, sampling_location, weights):
    return _peer("deformable_aggregation").forward(mc_ms_feat, spatial_shape, scale_start_index,
                                                   sampling_location, weights)


def official_deformable_aggregation_backward(grad_out, mc_ms_feat, spatial_shape, scale_start_index,
                                             sampling_location, weights):
    return _peer("deformable_aggregation").backward(grad_out, mc_ms_feat, spatial_shape, scale_start_index,
                                                    sampling_location, weights)


def load_for_benchmark(kind: str, opencl_gpu: bool, root: Optional[str] = None, skip: bool = False):
    """``(peer, None)``, or ``(None, reason)`` when the peer cannot be timed beside this run:
    skipped, no torch / CUDA / nvcc / staged sources, a failed build, or an OpenCL device that is
    no GPU (a CPU run is not compared with a CUDA kernel). Prints what happened."""
    loader = {"dcnv4": load_dcnv4, "deformable_aggregation": load_deformable_aggregation}[kind]
    reason = "skipped (--no-cuda-peer)" if skip else None
    if reason is None:
        try:
            _torch()
            if not opencl_gpu:
                reason = "the OpenCL device is not a GPU: the CUDA peer is compared only with a GPU run"
        except PeerUnavailable as exc:
            reason = str(exc)
    if reason is None:
        print(f"  building the official CUDA {kind} peer from {os.path.abspath(root or DEFAULT_ROOT)} ...",
              flush=True)
        try:
            peer = loader(root)
            print(f"  official CUDA {kind} peer ready ({peer.source}; build/load {peer.build_s:.1f} s, "
                  f"TORCH_CUDA_ARCH_LIST={os.environ.get('TORCH_CUDA_ARCH_LIST')})", flush=True)
            return peer, None
        except PeerUnavailable as exc:
            reason = str(exc)
    print(f"  CUDA peer unavailable ({kind}): {reason}", flush=True)
    if len(reason) > 4000:  # a compiler log: its end says what failed
        reason = reason[:1000] + " [...] " + reason[-3000:]
    return None, reason


def load_in_background(kind: str, opencl_gpu: bool, root: Optional[str] = None, skip: bool = False):
    """:func:`load_for_benchmark` in a thread (nvcc takes minutes): the benchmark times its own
    event-timed sections meanwhile and calls ``.result()`` -> ``(peer, reason)`` when it needs
    the peer. Wall-clock (as-called) figures must be taken only after that."""
    import concurrent.futures
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"build-{kind}")
    future = pool.submit(load_for_benchmark, kind, opencl_gpu, root, skip)
    pool.shutdown(wait=False)
    return future


def describe(peer) -> str:
    """For a report's meta: what was built, from which commit, with which torch."""
    torch = peer.torch
    return (f"{peer.source}, built in this run ({peer.build_s:.1f} s) with torch {torch.__version__} "
            f"CUDA {torch.version.cuda}, TORCH_CUDA_ARCH_LIST={os.environ.get('TORCH_CUDA_ARCH_LIST')}, "
            f"on {torch.cuda.get_device_name(0)}")


def to_cuda(a, dtype=None):
    """A CUDA tensor holding a numpy or pyopencl array's values (a copy through the host);
    ml_dtypes.bfloat16 becomes torch.bfloat16 on the same bits."""
    import numpy as np
    import torch
    host = np.ascontiguousarray(a.get() if hasattr(a, "get") else a)
    if host.dtype.name == "bfloat16":
        t = torch.from_numpy(host.view(np.int16)).view(torch.bfloat16).cuda()
    else:
        t = torch.from_numpy(host).cuda()
    return t if dtype is None else t.to(dtype)


def to_numpy(t):
    """A tensor's values on the host as numpy (torch.bfloat16 as ml_dtypes.bfloat16)."""
    import torch
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


# ---------------------------------------------------------------- timers

def _sync():
    import torch
    torch.cuda.synchronize()


def _backlog(torch):
    """Queue a short spin so the op's launches are enqueued before the device reaches the
    start event: the events then time the device's work, not the host's launch overhead."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(2_000_000)  # about 1 ms at the H200's clock


def time_events(fn: Callable, warmup: int = 3, repeat: int = 20) -> List[float]:
    """CUDA events on the current stream around ``fn()``: the op's device time, seconds."""
    import torch
    for _ in range(warmup):
        fn()
    _sync()
    samples = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        _backlog(torch)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e-3)
    return samples


def wall_as_called(fn: Callable, sync: Callable, warmup: int = 3, repeat: int = 50) -> List[float]:
    """Wall clock around one ``fn()`` and ``sync()``, seconds. The one loop both sides use:
    ``sync`` is ``torch.cuda.synchronize`` for the peer, ``queue.finish`` for ours."""
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - t0)
    return samples


def wall_pipelined(fn: Callable, sync: Callable, k: int = 50, warmup: int = 3, repeat: int = 5) -> List[float]:
    """Wall clock of ``k`` calls of ``fn`` back to back and one ``sync()``, divided by ``k``."""
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / k)
    return samples


def time_as_called(fn: Callable, warmup: int = 3, repeat: int = 50) -> List[float]:
    """Wall clock around one ``fn()`` and ``torch.cuda.synchronize()``, seconds."""
    return wall_as_called(fn, _sync, warmup, repeat)


def time_pipelined(fn: Callable, k: int = 50, warmup: int = 3, repeat: int = 5) -> List[float]:
    """Wall clock of ``k`` calls back to back and one synchronize, divided by ``k``, seconds."""
    return wall_pipelined(fn, _sync, k, warmup, repeat)


def budgeted(wanted: int, one_call_s: float, budget_s: float, least: int = 3) -> int:
    """How many runs of a measurement fit ``budget_s`` (at least ``least``, at most ``wanted``),
    so that a 100 ms backward is not run 50 times over."""
    if one_call_s <= 0:
        return wanted
    return max(least, min(wanted, int(budget_s / one_call_s)))


def median(samples: List[float]) -> float:
    return statistics.median(samples)
