"""The plans of warp_affine: what every call with one signature needs, made on its first call.

A plan (:class:`WarpPlan`, cached per call signature in ``runtime.plans`` by :mod:`.ops`) holds a
batch's chunks (:class:`Chunk`, one launch each, with its own kernel object and every fixed
argument set), the output's spec and the letterbox matrices, so that a call only sets its
buffers and enqueues. Beside it: the per-device choices that are part of a plan's key (SIMD
lanes, fma, unaligned loads and stores, the buffer limit), the work-group shape, and the
kernel's float8 matrix argument. :mod:`.ops` reads the per-device choices through its own
module's names, so tests and benchmarks override them there.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np
import pyopencl as cl

from .. import arrays, launch, memory
from ..launch import INPUT, OUTPUT, TEMP
from ..templates import Storage
from .geometry import invert_affine, letterbox_matrix
from .images import aligned_offsets, chunk_runs, span_of


TEMPLATE = "clkernels/warp_affine/warp_affine.cl.mako"
_TABLE_INTS = 16      # per image in a batch's table: ulong offset, H, W, pitch, step, d2i, pad


def lanes(runtime, dst_w: int) -> int:
    """Destination pixels per work-item: explicit SIMD on CPUs (PoCL does not vectorise
    this gather-heavy kernel across work-items by itself; with word loads 16 measured 7%
    faster than 8 on the 2-core EPYC, 8 faster than 16 with byte loads); two on GPUs (on an
    H200, 1.23x faster than one for a batch of 1080p images, and faster than four). A CPU gets
    at most its compiler's native float vector width (16 needs AVX-512: PoCL 3.0 on an AVX-2
    target aborts on 16-wide half conversions)."""
    want = min(16, runtime.info.native_vector_width_float) if runtime.info.is_cpu else 2
    while dst_w % want:
        want //= 2
    return want


def fma_name(runtime) -> str:
    """PoCL's library fma is an opaque call that keeps its work-item loops scalar; the
    compiler builtin is the same correctly rounded operation, inlined."""
    return "__builtin_fmaf" if runtime.info.vendor == "pocl" else "fma"


def unaligned_io(runtime) -> bool:
    """Whether loads and stores at any alignment are single instructions (CPUs): a corner's
    three channels are then read as one 4-byte word and a blob row stored as one vector, both
    through packed structs (PoCL makes vloadn/vstoren library calls). GPUs read bytes and
    store with vstoren. On the 2-core EPYC the two took 25-30% off the 1080p letterbox."""
    return runtime.info.is_cpu


def alloc_limit(runtime) -> int:
    """The largest buffer one launch may use (the device's max allocation)."""
    return int(runtime.info.max_alloc_bytes)


def _work_group(runtime, kernel, gx: int) -> Tuple[int, int]:
    """(lx, ly). CPUs: a destination row of work-items per group (PoCL runs a group as one
    loop; on the 2-core EPYC rows of 80 measured 5% faster than groups of 16, and rows keep
    the groups many enough to balance the cores). GPUs: 128 work-items, a row of them no
    wider than a row needs."""
    limit = min(runtime.info.max_work_group_size, kernel.get_work_group_info(
        cl.kernel_work_group_info.WORK_GROUP_SIZE, runtime.device))
    if runtime.info.is_cpu:
        return min(gx, limit), 1
    wg = arrays.work_group_size(runtime, kernel, 128)
    lx = min(wg, 1 << max(0, (gx - 1).bit_length()))
    return lx, max(1, wg // lx)


class Chunk:
    """One launch of a plan: images [start, stop), their packing when packed separately,
    and (batches) the table of their offsets, geometry and matrices."""

    __slots__ = ("start", "stop", "spans", "offsets", "total", "table", "uploaded")

    def __init__(self, start, stop, spans, table=None):
        self.start, self.stop, self.spans = start, stop, spans
        self.offsets, self.total = aligned_offsets(spans)
        self.table = table          # host int32 [k, 16], offsets patched per call
        self.uploaded = None        # (offsets, device table) of the last upload

    def device_table(self, rt, offsets):
        """The device table for these image offsets: the last one uploaded when they are the
        same (every repeat call of a fixed layout), else a new one."""
        uploaded = self.uploaded    # read once: another thread may replace it
        if uploaded is not None and uploaded[0] == offsets:
            return uploaded[1]
        host = self.table.copy()
        host.view(np.uint64)[:, 0] = offsets
        buf = cl.Buffer(rt.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                        hostbuf=host)
        self.uploaded = (offsets, buf)
        return buf


class WarpPlan:
    """What every call with one signature needs, made on its first call: the chunks with a
    launch each (own kernel, fixed arguments set), the output's spec, the letterbox matrices.

    The buffers of chunk c's launch are set per call from INPUT c (its images), OUTPUT c and
    TEMP c (a batch's table). One image's byte offset in its buffer (0 unless it is a view of
    a device array) and warp_affine's matrix are the only scalars set per call
    (:meth:`enqueue`)."""

    def __init__(self, rt, spec, geoms, on_device: bool, vec: int, fma: str,
                 unaligned: bool, limit: int, name: str):
        n = len(geoms)
        self.single = n == 1
        self.alloc_limit = limit
        if spec.kernel == "letterbox_blob":
            self.out = launch.Buffer("out", (n, 3, spec.dst_h, spec.dst_w), spec.dtype)
            self.d2i = np.stack([invert_affine(letterbox_matrix((w, h), (spec.dst_w, spec.dst_h)),
                                                f"the letterbox matrix of image {i}")
                                 for i, (h, w, _, _) in enumerate(geoms)])
            self.matrix_per_call = False
        else:
            self.out = launch.Buffer("out", (spec.dst_h, spec.dst_w, 3), spec.dtype)
            self.d2i, self.matrix_per_call = None, True
        per_image = self.out.nbytes // n
        if on_device and self.out.nbytes > limit:
            raise ValueError(f"the output ({self.out.nbytes} bytes) is larger than one buffer "
                             f"may be on {rt.info.name} ({limit} bytes); pass fewer images")
        spans = [span_of(g) for g in geoms]
        # Before the build: the output and the packed images must fit (on a CPU device, in the
        # host), or the driver would abort the process when the call allocates them.
        op = "letterbox" if spec.kernel == "letterbox_blob" else "warp_affine"
        memory.check(rt.info, self.out.nbytes + (sum(spans) if not on_device else 0),
                     f"{op}'s output ({self.out.shape} {self.out.dtype})",
                     largest=self.out.nbytes if on_device else min(self.out.nbytes, limit),
                     advice="use a smaller size or pass fewer images per call")
        st = Storage(spec.dtype) if spec.kernel == "letterbox_blob" else None
        # Letterbox matrices have no rotation or shear: the source row is one per work-item.
        # Word loads need 4 bytes in every image (all but 1x1 images), bytes in little-endian
        # order.
        program = launch.program(rt, TEMPLATE, fma=fma, vec=vec, single=self.single,
                                 mode="blob" if st else "hwc", st=st, swap_rb=spec.swap_rb,
                                 axis_aligned=spec.kernel == "letterbox_blob",
                                 word_loads=unaligned and min(spans) >= 4
                                 and bool(rt.device.endian_little),
                                 packed_stores=unaligned)
        gx = spec.dst_w // vec
        scalars = [np.float32(v) for v in (*spec.border, *spec.values)]
        self.chunks, steps = [], []
        for c, (a, b) in enumerate(chunk_runs(spans, per_image, limit, name)):
            kernel = launch.kernel_for_plan(program, spec.kernel)
            lx, ly = _work_group(rt, kernel, gx)
            size = (arrays.round_up(gx, lx), arrays.round_up(spec.dst_h, ly), b - a)
            n_first = np.int32(a if on_device else 0)   # host chunks have outputs of their own
            tail = [np.int32(spec.dst_w), np.int32(spec.dst_h), n_first, *scalars]
            if self.single:
                slots = [(0, INPUT, c), (7, OUTPUT, c)]
                fixed = [(1, np.uint64(0))] + [(2 + i, np.int32(v)) for i, v in enumerate(geoms[0])]
                if not self.matrix_per_call:
                    fixed.append((6, _float8(self.d2i[0])))
                fixed += [(8 + i, v) for i, v in enumerate(tail)]
                table = None
            else:
                slots = [(0, INPUT, c), (1, TEMP, c), (2, OUTPUT, c)]
                fixed = [(3 + i, v) for i, v in enumerate(tail)]
                table = np.zeros((b - a, _TABLE_INTS), np.int32)
                table[:, 2:6] = geoms[a:b]
                table[:, 6:12] = self.d2i[a:b].reshape(b - a, 6).astype(np.float32).view(np.int32)
            chunk = Chunk(a, b, spans[a:b], table)
            if table is not None:
                chunk.device_table(rt, chunk.offsets)   # the layout of separately packed images
            self.chunks.append(chunk)
            steps.append(launch.Step(kernel, size, (lx, ly, 1), slots, fixed))
        self.launch = launch.LaunchPlan([self.out], steps)
        # pyopencl's set_arg tries the argument as every kind of object before raw bytes
        # (about 9 us a scalar); the setter its own generated invokers use takes the bytes.
        self.setters = [getattr(s.kernel, "_set_arg_buf", s.kernel.set_arg) for s in steps]
        self.offsets = [0] * len(steps)   # one image's src_off as last set, per launch
        self.matrices = [None] * len(steps)   # and its matrix (the cached float8 object)

    def enqueue(self, queue, inputs, outputs, temps, wait, offset=0, matrix=None):
        """Launch every chunk with these buffers (one image: at byte ``offset`` of its buffer,
        with this float8 ``matrix`` when the plan takes one per call); returns the events."""
        events = []
        sources = (inputs, outputs, temps)
        with self.launch.lock:   # scalars, buffers and enqueue must not interleave across threads
            for c, step in enumerate(self.launch.steps):
                if self.single:
                    if offset != self.offsets[c]:
                        self.setters[c](1, np.uint64(offset))
                        self.offsets[c] = offset
                    if matrix is not None and matrix is not self.matrices[c]:
                        self.setters[c](6, matrix)
                        self.matrices[c] = matrix
                events.append(step.launch(queue, sources, wait if not events else None))
        return events


_matrix_args: dict = {}


def matrix_arg(d2i: np.ndarray) -> np.ndarray:
    """The float8 argument of a matrix, one object per distinct matrix, so that a plan sees by
    identity that the argument it set last is still the one wanted."""
    key = d2i.tobytes()
    arg = _matrix_args.get(key)
    if arg is None:
        if len(_matrix_args) > 256:
            _matrix_args.clear()
        arg = _matrix_args[key] = _float8(d2i)
    return arg


def _float8(d2i) -> np.ndarray:
    """A 2x3 matrix as the kernel's float8 argument (two entries unused)."""
    m = np.zeros(8, np.float32)
    m[:6] = np.asarray(d2i, np.float64).reshape(6)
    return m
