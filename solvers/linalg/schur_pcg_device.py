"""Launcher of ``schur_pcg_device.cl.mako``: iterative_schur's preconditioned conjugate gradients run
entirely on the OpenCL device, on the implicit Schur complement.

The host version (:func:`solvers.linalg.cg.conjugate_gradients` with a matrix-free product) waits for
the device once per CG iteration; at a few tens of thousands of observations that wait, not the
arithmetic, is most of the time. Here one iteration is five kernel enqueues of preset kernels
(six in the GPU layout) with nothing read back, the dot products summed in two stages over many
work-groups: the host enqueues a few iterations ahead, reads the 8-number state every ``CHECK_EVERY``
iterations, and the kernels do nothing once the state says the solve has ended. Same algorithm,
termination tests, iteration counts and messages as ``conjugate_gradients`` (Ceres'
``ConjugateGradientsSolver``); only the order of the floating-point sums differs.
"""
from __future__ import annotations

import collections

import numpy as np
import pyopencl as cl

from clkernels import arrays
from clkernels.launch import owned_kernel
from clkernels.templates import ctype, get_program, template_request

from . import inputs_device
from ..ba import ordering

TEMPLATE = "solvers/linalg/schur_pcg_device.cl.mako"
# Longest run of one camera's observations one work-item of camera_partials sums: cameras seen
# thousands of times spread over many work-items, whose partial sums cg_product adds. Short on
# GPUs, which need many work-items and whose loop iterations are slow; long on CPUs, where the
# work-items run one after another anyway and the sum over a camera's partials is serial.
MAX_SEGMENT_CPU = 256
MAX_SEGMENT_GPU = 16
# The GPU layout of the products (camera_rows, camera_partials per run and parameter): None uses
# it on GPUs for problems of at least SPLIT_MIN_OBSERVATIONS (below, the kernels take a few
# microseconds either way and the host's launches set the pace: the fused layout has one fewer);
# True or False forces it (the tests run both layouts on every device).
SPLIT_LAYOUT = None
SPLIT_MIN_OBSERVATIONS = 200_000
# The GPU layout's project_points stages each work-group's observations in local memory (see the
# template): True on in that layout, False off; STAGE_POINTS points per work-group, at most
# STAGE_MAX_OBSERVATIONS of their observations staged, groups with more read theirs directly.
# The local memory they take: the first of STAGE_LOCAL_FRACTIONS of the device's, or the second
# for a problem whose mean group would not fit the first (STAGE_WIDE None; True / False force
# either, for the tests).
STAGED_PROJECTION = True
STAGE_POINTS = 64
STAGE_MAX_OBSERVATIONS = 512
STAGE_LOCAL_FRACTIONS = (0.5, 1.0)
STAGE_WIDE = None
# Iterations enqueued between two reads of the state (the reads overlap the next batch).
CHECK_EVERY = 4
RESIDUAL_RESET_PERIOD = 10

# State slots and statuses (the #defines of the template).
S_STATUS, S_ITER, S_RHO, S_Q0, S_TOL_R, S_VALUE = range(6)
RUNNING, B_ZERO, R_SMALL, ZETA, MAX_ITER, INDEFINITE = 0, 1, 2, 3, 4, 5
FAIL_RHO, FAIL_BETA, FAIL_ALPHA = -1, -2, -3
# cg_advance's modes
STEP, STEP_NO_R, RESET = 1, 2, 3


def stage_capacities(runtime, R, P, dtype) -> tuple:
    """The observations per work-group that the staged project_points kernel may be given room
    for (their t and E rows in local memory), smaller first, without repeats: STAGE_MAX_OBSERVATIONS, or fewer
    where they would take over a fraction (STAGE_LOCAL_FRACTIONS) of the device's local memory.
    They depend on the device alone (a new problem size builds nothing)."""
    per_observation = R * (1 + P) * np.dtype(dtype).itemsize
    caps = (max(1, min(STAGE_MAX_OBSERVATIONS, int(runtime.info.local_mem_bytes * f) // per_observation))
            for f in STAGE_LOCAL_FRACTIONS)
    return tuple(sorted(set(caps)))


def program_request(runtime, C, P, R, dtype):
    """The CG's program (both layouts, the staging's capacity an argument) for
    :func:`clkernels.templates.prefetch`; :class:`DevicePCG` builds exactly this one."""
    stages = stage_capacities(runtime, R, P, dtype) if STAGED_PROJECTION else ()
    return template_request(TEMPLATE, C=C, P=P, R=R, L=work_items_per_group(runtime), STAGED=bool(stages),
                            LP=STAGE_POINTS, REAL=ctype(dtype), ACC=ctype(accumulator_dtype(runtime)))


def work_items_per_group(runtime) -> int:
    """The cg_* kernels' work-groups (one work-item per camera): small on CPUs, where PoCL runs
    a group per core, so a few tens of cameras still make groups for both cores."""
    return 8 if runtime.info.is_cpu else 64


def accumulator_dtype(runtime) -> np.dtype:
    """The type of the device's sums and of the CG state: float64 wherever the device has fp64
    (also under float32 storage), else float32."""
    return np.dtype(np.float64 if runtime.info.fp64 else np.float32)


def _camera_segments(cam, pt, nc, max_len, order=None):
    """Observations in camera order (point order within a camera) cut into runs of about
    ``max_len`` of one camera, never inside one camera-point group (jacobi_blocks sums a group
    before its product). Returns the observation order, the runs' starts (nseg + 1; a run may be
    empty) and each camera's first run (nc + 1). ``order``, when given, is that observation order
    already (``np.argsort(cam, kind="stable")``, as ``Evaluator.camera_order`` has it)."""
    if order is None:
        order = ordering.stable_order(cam, nc)              # stable: point order within a camera
    counts = ordering.counts(cam, nc)
    runs, at = _runs(counts, max_len)
    if not np.any(np.take(pt, np.take(order, at)) == np.take(pt, np.take(order, at - 1))):
        return order, runs.start, runs.item_run
    return order, _group_cuts(pt, order, counts, runs), runs.item_run


def _runs(counts, max_len):
    """The cameras' runs of at most ``max_len`` observations (ordering.cut_runs of their
    observation ranges) and where cuts fall inside a camera (to check against its groups)."""
    first_obs = np.concatenate(([0], np.cumsum(counts)))
    runs = ordering.cut_runs(first_obs, max_len)         # a camera without observations: none
    return runs, runs.start[:-1][np.flatnonzero(runs.k > 0)]


def _group_cuts(pt, order, counts, runs):
    """The runs' starts moved to the next group start (a camera's start, or where the point
    changes within a camera): needed only when a cut falls inside a group, which is rare."""
    first_obs = np.concatenate(([0], np.cumsum(counts)))
    group_start = ordering.changes(pt, order)
    group_start[first_obs[:-1][counts > 0]] = True
    start = np.minimum(ordering.next_true(group_start, runs.start[:-1]), first_obs[runs.owner + 1])
    return np.concatenate((start, [order.size]))


def _camera_segments_device(dev, max_len):
    """:func:`_camera_segments` of observations ordered on the device
    (solvers.ba.observations_device): the cameras' counts and the few observations at the cuts are
    read back; the order itself stays there (and is read back only when a cut falls inside a
    group)."""
    runs, at = _runs(dev.camera_counts, max_len)
    if at.size:
        points = dev.gather_host("pt", dev.gather_host("camera_order", np.concatenate((at, at - 1))))
        if np.any(points[:at.size] == points[at.size:]):
            start = _group_cuts(dev.host("pt"), dev.host("camera_order"), dev.camera_counts, runs)
            return start, runs.item_run
    return runs.start, runs.item_run


class DevicePCG:
    """The device buffers, index arrays and kernels of one problem's iterative_schur solves.

    Built once per solve (the structure does not change); :meth:`bind_jacobian` after every new
    Jacobian, :meth:`solve` for every linear system. ``C``, ``P``, ``R`` are the model's camera,
    point and residual block sizes; ``dtype`` is the storage type of the Jacobian blocks and the
    vectors (sums and the CG state are float64 wherever the device has fp64)."""

    def __init__(self, runtime, cam, pt, num_cameras, num_points, C=9, P=3, R=2, dtype=np.float64,
                 camera_order=None, device_observations=None):
        """``cam``, ``pt``: the observations' indices in point order (host), or None with
        ``device_observations`` (solvers.ba.observations_device: everything made on the device)."""
        self.rt = rt = runtime
        dev = device_observations
        if dev is None:
            cam, pt = np.asarray(cam), np.asarray(pt)      # int32 from the Evaluator: no copies
        n, nc, npt = (dev.n if dev is not None else cam.size), int(num_cameras), int(num_points)
        self.C, self.P, self.R, self.T = C, P, R, C * (C + 1) // 2
        if max(n * R * max(C, P), C * nc, P * P * npt) >= 2 ** 31:
            raise ValueError("the device CG indexes with 32-bit ints: problem too large")
        self.dtype = dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            raise ValueError(f"dtype must be float32 or float64, got {dtype}")
        if dtype == np.float64 and not rt.info.fp64:
            raise ValueError(f"float64 needs a device with fp64; {rt.info.name!r} has none: use float32")
        self.acc = accumulator_dtype(rt)
        self.n, self.nc, self.npt = n, nc, npt
        max_segment = MAX_SEGMENT_CPU if runtime.info.is_cpu else MAX_SEGMENT_GPU
        # Index arrays the kernels only read: over the host arrays on a CPU device, else copies.
        i32 = lambda a: inputs_device.read_only(rt, np.ascontiguousarray(a, dtype=np.int32))  # noqa: E731
        if dev is not None:
            seg_start, cam_seg = _camera_segments_device(dev, max_segment)
            self.cam, self.pt, self.pt_start, self.obs = dev.cam, dev.pt, dev.pt_start, dev.camera_order
        else:
            order, seg_start, cam_seg = _camera_segments(cam, pt, nc, max_segment, camera_order)
            pt_start = ordering.starts(pt, npt)              # pt is sorted: counts, not searches
            self.cam, self.pt, self.pt_start, self.obs = i32(cam), i32(pt), i32(pt_start), i32(order)
        self.nseg = seg_start.size - 1
        # Cameras with observations and their first runs: where jacobi_sums' partials go.
        self._seen_cams = np.flatnonzero(np.diff(cam_seg) > 0)
        self._seen_first_run = cam_seg[self._seen_cams]
        self.seg_start, self.cam_seg = i32(seg_start), i32(cam_seg)
        self.L = L = work_items_per_group(rt)
        self.G = G = max(1, -(-nc // L))               # groups of cg_start/advance/direction
        self.G_pq = G_pq = max(1, -(-(C * nc) // L))   # cg_product's, one item per camera entry
        # scratch: written by kernels and read by later ones (see arrays.scratch on the simulator)
        real = lambda size: arrays.scratch(rt, max(1, int(size)), dtype)  # noqa: E731
        sums = lambda size: arrays.scratch(rt, max(1, int(size)), self.acc)  # noqa: E731
        self.split = split = (not rt.info.is_cpu and n >= SPLIT_MIN_OBSERVATIONS) if SPLIT_LAYOUT is None \
            else bool(SPLIT_LAYOUT)
        self.w = real(R * n)
        self.t = real(R * n) if split else None     # camera_rows' F v (GPUs)
        # GPUs: F in camera order, for camera_partials_split (one more copy of F, which
        # lm_device.device_bytes counts)
        self.Jcc = real(R * C * n) if split else None
        self.partial = sums(C * self.nseg)
        self.b, self.x, self.r, self.p, self.z, self.q, self.dc2 = (real(C * nc) for _ in range(7))
        self.Vinv, self.Pinv = real(P * P * npt), real(C * C * nc)
        self.gp, self.yc, self.yp = real(P * npt), real(C * nc), real(P * npt)
        self.blocks = sums(self.T * self.nseg)
        self.dots_pq, self.dots = sums(G_pq), sums(3 * G)
        self._vinv_for = None       # the host V^-1 whose copy self.Vinv holds
        # The CG state, double-buffered (see the template's header): iteration i reads
        # states[i % 2] and writes states[(i + 1) % 2].
        self.states = (sums(8), sums(8))
        # Both layouts are in the program (the choice above depends on the size, and a new size
        # must build nothing); the staging's capacity is a kernel argument, chosen here.
        stages = stage_capacities(rt, R, P, dtype) if STAGED_PROJECTION else ()
        wide = len(stages) > 1 and (STAGE_WIDE if STAGE_WIDE is not None
                                    else n * STAGE_POINTS > stages[0] * max(1, npt))
        self.stage = (stages[-1] if wide else stages[0]) if split and stages else 0
        prg = get_program(TEMPLATE, rt, **program_request(rt, C, P, R, dtype).params)
        self._program = prg
        # Kernel objects of this instance alone, one per use and state parity, their arguments
        # set once (here and in bind_jacobian): an iteration is then five enqueues and nothing
        # else (templates.kernel's shared objects would let two solves overwrite each other's
        # arguments).
        K = lambda name: owned_kernel(prg, name, self)  # noqa: E731
        self.k_jacobi, self.k_back = K("jacobi_blocks"), K("back_substitute")
        # project_points of p, of x and (at the start) of the residuals, per parity; on GPUs
        # camera_rows first makes t = F v for p and x
        layout = "_split" if split else ""
        self.k_project = {(v, s): K("project_points" + layout) for v in ("p", "x", "f") for s in (0, 1)}
        self.k_rows = {(v, s): K("camera_rows") for v in ("p", "x") for s in (0, 1)} if split else {}
        self.k_order = K("camera_order_blocks") if split else None
        self.k_partials = [K("camera_partials" + layout) for s in (0, 1)]
        self.k_direction = [K("cg_direction") for s in (0, 1)]
        # Small groups on CPUs: PoCL runs a group per core at a time, and a few hundred segments
        # in groups of 64 leave one core idle at the end (8 was a third faster for the partials).
        ls = 8 if rt.info.is_cpu else 64
        self.ls_points = STAGE_POINTS if self.stage else arrays.work_group_size(rt, self.k_project["p", 0], ls)
        self.ls_partials = arrays.work_group_size(rt, self.k_partials[0], ls)
        self.gs_points = arrays.round_up(max(1, npt), self.ls_points)
        self.gs_rows = arrays.round_up(max(1, R * n), STAGE_POINTS)      # camera_rows' groups: LP rows
        self.ls_order = arrays.work_group_size(rt, self.k_order) if split else 1
        self.gs_order = arrays.round_up(max(1, R * C * n), self.ls_order)
        self.gs_segments = arrays.round_up(max(1, self.nseg), self.ls_partials)
        self.gs_partials = arrays.round_up(max(1, self.nseg * (C if split else 1)), self.ls_partials)
        st = self.states
        i32n = np.int32
        for s in (0, 1):
            self.k_partials[s].set_args(None, self.w.data, self.obs.data, self.seg_start.data,
                                        self.partial.data, st[s].data, i32n(self.nseg))
            self.k_direction[s].set_args(self.z.data, self.p.data, self.dots_pq.data, self.dots.data,
                                         st[s].data, st[1 - s].data, i32n(nc), i32n(G), i32n(G_pq),
                                         i32n(0), self.acc.type(0), self.acc.type(0))
        # cg_start, cg_product and cg_advance read S's products as per-run partials and each
        # camera's runs; a part of a split solve gives them the parts' summed products instead
        # (split_begin).
        self.k_start, self.k_product, self.k_advance = self._cg_kernels(self.partial, self.cam_seg)
        self._split_kit = None
        self._jacobian = None
        self._jcc_current = False   # whether Jcc holds the bound Jacobian's F (GPU layout)
        # project_points_split's local buffers for t and E rows, and their capacity (staged only)
        item = dtype.itemsize
        self._staging = (cl.LocalMemory(self.stage * R * item), cl.LocalMemory(self.stage * R * P * item),
                         np.int32(self.stage)) if self.stage else ()
        # Kernel events of the solves (for a profile; None: not kept) and bytes read back.
        self.events = None
        self.bytes_to_host = self.bytes_to_device = 0

    def _cg_kernels(self, partial, cam_seg):
        """cg_start, cg_product (per parity) and cg_advance (per mode and parity) reading the
        products from ``partial`` (runs, C) summed per camera over ``cam_seg``'s runs."""
        K = lambda name: owned_kernel(self._program, name, self)  # noqa: E731
        i32n, st, nc = np.int32, self.states, self.nc
        start = K("cg_start")
        start.set_args(partial.data, cam_seg.data, self.Pinv.data, self.b.data, self.x.data, self.r.data,
                       self.z.data, self.dots.data, i32n(nc))
        product = [K("cg_product") for s in (0, 1)]
        advance = {(m, s): K("cg_advance") for m in (STEP, STEP_NO_R, RESET) for s in (0, 1)}
        for s in (0, 1):
            product[s].set_args(partial.data, cam_seg.data, self.dc2.data, self.p.data, self.q.data,
                                self.dots_pq.data, st[s].data, i32n(nc))
            for m in (STEP, STEP_NO_R, RESET):
                advance[m, s].set_args(
                    partial.data, cam_seg.data, self.dc2.data, self.Pinv.data, self.b.data, self.x.data,
                    self.r.data, self.p.data, self.z.data, self.q.data, self.dots_pq.data, self.dots.data,
                    st[s].data, i32n(nc), i32n(self.G_pq), i32n(m))
        return start, product, advance

    def bind_jacobian(self, Jc_dev, Jp_dev, r_dev):
        """The device Jacobian blocks (n, R, C), (n, R, P) and residuals (n * R) of the linear
        systems to come (kept referenced while bound); nothing to do when they are bound already."""
        # The same buffers may hold new values (a caller that rewrites its Jacobian in place):
        # the camera-ordered copy of F is made again before the next product either way.
        self._jcc_current = False
        if self._jacobian is not None and all(a is b for a, b in zip(self._jacobian, (Jc_dev, Jp_dev, r_dev))):
            return
        n, C, P, R, dt = self.n, self.C, self.P, self.R, self.dtype
        for a, shape in ((Jc_dev, (n, R, C)), (Jp_dev, (n, R, P))):
            if a.dtype != dt or a.size != int(np.prod(shape)):
                raise ValueError(f"expected {dt} device blocks of shape {shape}, got {a.shape} {a.dtype}")
        if r_dev.dtype != dt or r_dev.size != R * n:
            raise ValueError(f"expected {R * n} {dt} residuals, got {r_dev.shape} {r_dev.dtype}")
        self._jacobian = (Jc_dev, Jp_dev, r_dev)
        vectors = {"p": self.p.data, "x": self.x.data, "f": r_dev.data}
        for (v, s), k in self.k_project.items():
            if self.split:
                k.set_args(Jp_dev.data, self.pt_start.data, self.Vinv.data,
                           r_dev.data if v == "f" else self.t.data, self.w.data, self.states[s].data,
                           np.int32(self.npt), *self._staging)
            else:
                k.set_args(Jc_dev.data, Jp_dev.data, self.cam.data, self.pt_start.data, self.Vinv.data,
                           vectors[v], self.w.data, self.states[s].data, np.int32(self.npt),
                           np.int32(1 if v == "f" else 0))
        for (v, s), k in self.k_rows.items():
            k.set_args(Jc_dev.data, self.cam.data, vectors[v], self.t.data, self.states[s].data,
                       np.int32(self.n))
        if self.split:      # the camera-ordered copy of F that camera_partials_split reads
            self.k_order.set_args(Jc_dev.data, self.obs.data, self.Jcc.data, np.int32(self.n))
        for k in self.k_partials:
            k.set_arg(0, (self.Jcc if self.split else Jc_dev).data)
        self.k_jacobi.set_args(Jc_dev.data, Jp_dev.data, self.obs.data, self.pt.data, self.seg_start.data,
                               self.Vinv.data, self.blocks.data, np.int32(self.nseg))
        self.k_back.set_args(Jc_dev.data, Jp_dev.data, self.cam.data, self.pt_start.data, self.Vinv.data,
                             self.gp.data, self.yc.data, self.yp.data, np.int32(self.npt))
        self._vinv_for = None

    def unbind_jacobian(self):
        """Forget the bound Jacobian (its memory can go before the next one is made)."""
        self._jacobian = None

    def _upload_vinv(self, Vinv, pending):
        """Copy ``Vinv`` (npt, P, P) to the device unless this very array is there already."""
        if self._vinv_for is not Vinv:
            arrays.write_async(self.rt, self.Vinv, np.asarray(Vinv, self.dtype), pending)
            self._vinv_for = Vinv

    def jacobi_sums(self, Vinv):
        """Per camera, ``sum over its points of G V^-1 G^T`` (nc, C, C): what the pairs subtract
        from ``B + Dc^2`` in S's diagonal blocks (the Schur-Jacobi preconditioner)."""
        self._check_bound()
        q, pending, C = self.rt.queue, [], self.C
        self._upload_vinv(Vinv, pending)
        out = np.zeros((self.nc, C, C))
        if not self.nseg:
            return out
        cl.enqueue_nd_range_kernel(q, self.k_jacobi, (self.gs_segments,), (self.ls_partials,))
        part = np.empty((self.nseg, self.T), self.acc)
        cl.enqueue_copy(q, part, self.blocks.data)
        tri = self._per_camera(part)                                                # (cameras seen, T)
        rows, cols = np.triu_indices(C)
        out[self._seen_cams[:, None], rows, cols] = tri
        out[self._seen_cams[:, None], cols, rows] = tri
        return out

    def _per_camera(self, part):
        """Per-run partial sums (nseg, ...) summed per camera with observations (in order)."""
        return np.add.reduceat(part.astype(np.float64), self._seen_first_run, axis=0)

    def back_substitute(self, Vinv, gp, yc):
        """The points' step ``V^-1 (gp - W^T yc)`` per point (npt, P), on the device."""
        self._check_bound()
        q, pending = self.rt.queue, []
        self._upload_vinv(Vinv, pending)
        arrays.write_async(self.rt, self.gp, np.asarray(gp, self.dtype), pending)
        arrays.write_async(self.rt, self.yc, np.asarray(yc, self.dtype), pending)
        yp = np.zeros((self.npt, self.P), self.dtype)
        if self.npt:
            cl.enqueue_nd_range_kernel(q, self.k_back, (self.gs_points,), (self.ls_points,))
            cl.enqueue_copy(q, yp, self.yp.data)
        return yp

    def _check_bound(self):
        if self._jacobian is None:
            raise RuntimeError("bind_jacobian() before solve()")

    def _enqueue(self, name, kernel, global_size, local_size):
        event = cl.enqueue_nd_range_kernel(self.rt.queue, kernel, global_size, local_size)
        if self.events is not None:
            self.events.append((name, event))

    def _apply(self, v, parity):
        """Enqueue ``w = (I - E V^-1 E^T) t`` per observation (t = F v, or f for ``v == "f"``) and
        its camera runs' sums into ``self.partial``."""
        if self.split and not self._jcc_current and self.n:
            self._enqueue("camera_order_blocks", self.k_order, (self.gs_order,), (self.ls_order,))
            self._jcc_current = True
        if self.npt:
            if (v, parity) in self.k_rows:
                self._enqueue("camera_rows", self.k_rows[v, parity], (self.gs_rows,), (STAGE_POINTS,))
            self._enqueue("project_points", self.k_project[v, parity], (self.gs_points,), (self.ls_points,))
        if self.nseg:
            self._enqueue("camera_partials_cg", self.k_partials[parity], (self.gs_partials,),
                          (self.ls_partials,))

    def _vectors(self, name, kernel):
        self._enqueue(name, kernel, (self.G * self.L,), (self.L,))

    def _iteration(self, i):
        """Enqueue CG iteration ``i`` (1, 2, ...): a residual reset every RESIDUAL_RESET_PERIOD."""
        s = i % 2
        self._apply("p", s)
        self._enqueue("cg_product", self.k_product[s], (self.G_pq * self.L,), (self.L,))
        if i % RESIDUAL_RESET_PERIOD == 0:      # r = b - S x, as Ceres does
            self._vectors("cg_advance", self.k_advance[STEP_NO_R, s])
            self._apply("x", s)
            self._vectors("cg_advance", self.k_advance[RESET, s])
        else:
            self._vectors("cg_advance", self.k_advance[STEP, s])
        self._vectors("cg_direction", self.k_direction[s])

    def solve(self, Vinv, Dc2, Pinv, q_tolerance=0.1, r_tolerance=-1.0, max_iterations=500):
        """PCG from ``x = 0`` on ``S = F^T (I - E V^-1 E^T) F + diag(Dc2)`` with right-hand side
        ``F^T (f - E V^-1 E^T f)`` and preconditioner blocks ``Pinv`` (nc, C, C), all host arrays.
        Returns ``(x (nc * C) or None, ok, iterations, message)`` as ``conjugate_gradients`` does."""
        self._check_bound()
        # Non-blocking uploads: their events (kept until the solve has waited on the queue)
        # hold the host arrays.
        uploads = []
        self._upload_vinv(Vinv, uploads)
        for dev, host in ((self.dc2, Dc2), (self.Pinv, Pinv)):
            arrays.write_async(self.rt, dev, np.ascontiguousarray(host, self.dtype), uploads)
        try:
            return self.run(q_tolerance, r_tolerance, max_iterations)
        finally:
            for event in uploads:
                event.wait()

    def device_inputs_written(self):
        """``Vinv``, ``dc2`` and ``Pinv`` were written on the device (solvers.ba.lm_device): no host
        copy of V^-1 is current any more."""
        self._vinv_for = None

    def run(self, q_tolerance=0.1, r_tolerance=-1.0, max_iterations=500, read_x=True):
        """The PCG of :meth:`solve` on what ``self.Vinv``, ``self.dc2`` and ``self.Pinv`` hold on the
        device. With ``read_x=False`` the solution stays in ``self.x`` (x is None in the result)."""
        self._check_bound()
        q = self.rt.queue
        max_iterations = max(1, int(max_iterations))
        uploads = []
        self._begin(q_tolerance, r_tolerance, max_iterations, uploads)
        self._apply("f", 0)
        self._vectors("cg_start", self.k_start)
        self._vectors("cg_direction", self.k_direction[0])
        # Batches of CHECK_EVERY iterations, each followed by a non-blocking read of the state it
        # leaves; the host looks at a batch's state only once the next batch is queued, so the
        # device never idles while the host decides. The last iteration always ends the solve.
        reads, it, state = collections.deque(), 1, None
        try:
            while state is None:
                if it <= max_iterations:
                    stop = min(max_iterations, it + CHECK_EVERY - 1)
                    for i in range(it, stop + 1):
                        self._iteration(i)
                    it = stop + 1
                    host = np.empty(8, self.acc)
                    reads.append((host, cl.enqueue_copy(q, host, self.states[it % 2].data,
                                                        is_blocking=False)))
                    self.bytes_to_host += host.nbytes
                    if len(reads) < 2 and it <= max_iterations:
                        continue
                if not reads:
                    raise RuntimeError("device CG ended without a termination state")
                host, event = reads.popleft()
                event.wait()
                if host[S_STATUS] != RUNNING:
                    state = host.astype(np.float64)
        finally:
            for _, event in reads:   # the reads write into host arrays: let them land first
                event.wait()
            for event in uploads:
                event.wait()
        return self._result(state, q_tolerance, read_x)

    def apply(self, Vinv, v=None):
        """Per camera (nc, C), the sum over its observations of ``F_o^T w_o`` with
        ``w = (I - E V^-1 E^T) t`` per point, for ``t = F v`` (``v`` a host camera vector, nc * C:
        ``S v`` without ``Dc^2``) or, with ``v`` None, ``t`` = the bound residuals (the reduced
        right-hand side ``gc - W V^-1 gp``). For a caller that runs its own CG on the host (the
        general core's iterative_schur, :mod:`solvers.general.implicit_schur_device`)."""
        self._check_bound()
        q, pending = self.rt.queue, []
        self._upload_vinv(Vinv, pending)
        arrays.write_async(self.rt, self.states[0], np.zeros(8, self.acc), pending)     # RUNNING
        if v is not None:
            arrays.write_async(self.rt, self.p, np.ascontiguousarray(v, self.dtype), pending)
        out = np.zeros((self.nc, self.C))
        if self.nseg:
            self._apply("f" if v is None else "p", 0)
            part = np.empty((self.nseg, self.C), self.acc)
            cl.enqueue_copy(q, part, self.partial.data)
            out[self._seen_cams] = self._per_camera(part)
        for event in pending:
            event.wait()
        return out

    # -- a part of a split solve (solvers.split.partitioned_device; run_split drives them) ----------
    # Every part holds the same camera vectors and runs the same CG kernels on them; only S's
    # products cross: each part sums its runs' partials per camera on the device (camera_sums),
    # the host adds the parts' sums, and cg_start, cg_product and cg_advance read the total back
    # as one run per camera. The host drives the iterations one at a time (a reduction per
    # product) and reads the CG state with every product.
    def split_begin(self, q_tolerance=0.1, r_tolerance=-1.0, max_iterations=500):
        """Start a split solve (on what Vinv, dc2 and Pinv hold on the device)."""
        self._check_bound()
        self._begin(q_tolerance, r_tolerance, max_iterations, [])     # (the write done on return)

    @property
    def _split(self):
        """The split solve's buffers and kernels, made by their first use."""
        if self._split_kit is None:
            C, T, nc = self.C, self.T, self.nc
            total = arrays.scratch(self.rt, max(1, nc * max(C, T)), self.acc)
            ident = arrays.to_device(self.rt, np.arange(nc + 1, dtype=np.int32))
            sums = arrays.scratch(self.rt, max(1, nc * max(C, T)), self.acc)
            kernels = {}
            for name, rows, width in (("partials", self.partial, C), ("blocks", self.blocks, T)):
                k = kernels[name] = owned_kernel(self._program, "camera_sums", self)
                k.set_args(rows.data, self.cam_seg.data, sums.data, np.int32(nc), np.int32(width))
            self._split_kit = dict(total=total, ident=ident, sums=sums, camera_sums=kernels,
                                   cg=self._cg_kernels(total, ident))
        return self._split_kit

    def _begin(self, q_tolerance, r_tolerance, max_iterations, pending):
        """The CG state RUNNING at iteration 0 (its write's event into ``pending``), and the
        termination tests' parameters."""
        arrays.write_async(self.rt, self.states[0], np.zeros(8, self.acc), pending)
        self.bytes_to_device += 8 * self.acc.itemsize
        for k in self.k_direction:
            k.set_arg(9, np.int32(max(1, int(max_iterations))))
            k.set_arg(10, self.acc.type(q_tolerance))
            k.set_arg(11, self.acc.type(r_tolerance))

    def _read_camera_sums(self, name, width):
        """camera_sums of the partials or the blocks, read back (nc, width)."""
        out = np.zeros((self.nc, width), self.acc)
        if self.nseg:
            ls = self.ls_partials
            self._enqueue("camera_sums", self._split["camera_sums"][name], (arrays.round_up(self.nc * width, ls),), (ls,))
            cl.enqueue_copy(self.rt.queue, out, self._split["sums"].data)
            self.bytes_to_host += out.nbytes
        return out

    def split_share(self, v, parity):
        """This part's share of a product per camera (nc * C), and the CG state of ``parity``
        (8 values) as the iteration about to run reads it. ``v``: "f" (the right-hand side
        ``F^T (f - E V^-1 E^T f)``), "p" or "x" (``F^T (I - E V^-1 E^T) F v``, without Dc^2)."""
        state = np.empty(8, self.acc)
        read = cl.enqueue_copy(self.rt.queue, state, self.states[parity].data, is_blocking=False)
        self._apply(v, parity)
        share = self._read_camera_sums("partials", self.C).ravel()
        read.wait()
        self.bytes_to_host += state.nbytes
        return share, state

    def split_total(self, total):
        """Write the parts' summed product (nc * C) or ``G V^-1 G^T`` blocks (nc * T) where the
        next kernel reads them."""
        if total.size:
            cl.enqueue_copy(self.rt.queue, self._split["total"].data, np.ascontiguousarray(total, self.acc))
            self.bytes_to_device += total.size * self.acc.itemsize

    def split_start(self):
        """After the right-hand side's total: b = r, x = 0, z = M r, the first direction."""
        self._vectors("cg_start", self._split["cg"][0])
        self._vectors("cg_direction", self.k_direction[0])

    def split_product(self, parity):
        """After the total of ``S p``'s share: q = S p."""
        self._enqueue("cg_product", self._split["cg"][1][parity], (self.G_pq * self.L,), (self.L,))

    def split_advance(self, mode, parity):
        """x and r advance (``mode`` STEP; or STEP_NO_R, then RESET after the total of ``S x``)."""
        self._vectors("cg_advance", self._split["cg"][2][mode, parity])

    def split_direction(self, parity):
        self._vectors("cg_direction", self.k_direction[parity])

    def split_result(self, state, q_tolerance):
        """``(ok, iterations, message)`` of a split solve that ended with ``state``; the solution
        stays in ``self.x``."""
        _, ok, its, msg = self._result(np.asarray(state, np.float64), q_tolerance, read_x=False)
        return ok, its, msg

    def part_jacobi_sums(self):
        """This part's ``sum over its points of G V^-1 G^T`` per camera, upper triangles (nc * T),
        with the device's ``Vinv``."""
        self.jacobi_blocks()
        return self._read_camera_sums("blocks", self.T).ravel()

    def split_jacobi_total(self, total):
        """Write the parts' summed ``G V^-1 G^T`` blocks (nc * T); returns them and one run per
        camera, as schur_jacobi reads its blocks."""
        self.split_total(total)
        return self._split["total"], self._split["ident"]

    def jacobi_blocks(self):
        """Enqueue ``jacobi_blocks`` into ``self.blocks`` (nseg, T) from the device ``self.Vinv``."""
        self._check_bound()
        if self.nseg:
            self._enqueue("jacobi_blocks", self.k_jacobi, (self.gs_segments,), (self.ls_partials,))
        return self.blocks

    def back_substitute_solution(self):
        """Enqueue the points' step ``V^-1 (gp - W^T x)`` for the CG solution ``self.x`` and what
        ``self.gp`` holds on the device, into ``self.yp``; returns ``self.yp``."""
        self._check_bound()
        if self.npt:
            if self.nc:
                cl.enqueue_copy(self.rt.queue, self.yc.data, self.x.data, byte_count=self.x.nbytes)
            self._enqueue("back_substitute", self.k_back, (self.gs_points,), (self.ls_points,))
        return self.yp

    def _result(self, state, q_tolerance, read_x=True):
        status, its, value = int(state[S_STATUS]), int(state[S_ITER]), state[S_VALUE]
        if status < 0:
            msg = {FAIL_RHO: f"Numerical failure. rho = r'z = {value:e}.",
                   FAIL_BETA: f"Numerical failure. beta = rho_n / rho_(n-1) = {value:e}.",
                   FAIL_ALPHA: f"Numerical failure. alpha = rho / pq = {value:e}."}[status]
            return None, False, its, msg
        msg = {B_ZERO: "Convergence. |b| = 0.",
               R_SMALL: "Convergence. |r| <= tol_r.",
               ZETA: f"Iteration: {its} Convergence: zeta = {value:e} < {q_tolerance:e}.",
               MAX_ITER: "Maximum number of iterations reached.",
               INDEFINITE: f"Matrix is indefinite, no more progress can be made. p'q = {value:e}."}[status]
        if not read_x:
            return None, True, its, msg
        x = np.zeros(self.C * self.nc, self.dtype)
        if status != B_ZERO and x.size:
            cl.enqueue_copy(self.rt.queue, x, self.x.data)
        return x, True, its, msg


def run_split(pcgs, each, reduce, q_tolerance=0.1, r_tolerance=-1.0, max_iterations=500):
    """The PCG of :meth:`DevicePCG.run` over the parts ``pcgs`` of a split solve (and, through
    ``reduce``, every other process's): ``each(fn, pcgs)`` runs ``fn`` on every part (at once),
    ``reduce(local)`` sums a vector over every process. The iterations are
    :meth:`DevicePCG._iteration`'s, one at a time, each product's shares summed and written back
    before the kernels that read it. Returns ``(ok, iterations, message)``; the solution stays in
    every part's ``x``."""
    each(lambda p: p.split_begin(q_tolerance, r_tolerance, max_iterations), pcgs)

    def total_of(v, parity):
        """The parts' shares of a product summed and written back on every part; None, or the
        state (the same on every part) when the iteration about to run finds the solve ended."""
        shares = each(lambda p: p.split_share(v, parity), pcgs)
        status = [float(state[S_STATUS]) for _, state in shares]
        # With the sum, on every process: the parts' statuses, to see that they agree.
        total = reduce(np.concatenate([np.sum([share for share, _ in shares], axis=0),
                                       [sum(status), sum(t * t for t in status), len(status)]]))
        s, s2, k = total[-3:]
        if s2 * k != s * s:
            raise RuntimeError("the parts' conjugate gradients disagree on when to stop: their devices "
                               "round differently; split the solve over devices of one kind")
        if s != RUNNING:
            return shares[0][1]
        each(lambda p: p.split_total(total[:-3]), pcgs)
        return None

    ended = total_of("f", 0)
    if ended is None:
        each(lambda p: p.split_start(), pcgs)
        i = 1
        while True:
            s = i % 2
            ended = total_of("p", s)
            if ended is not None:
                break
            each(lambda p: p.split_product(s), pcgs)
            if i % RESIDUAL_RESET_PERIOD == 0:       # r = b - S x, as Ceres does
                each(lambda p: p.split_advance(STEP_NO_R, s), pcgs)
                ended = total_of("x", s)
                if ended is not None:
                    break
                each(lambda p: p.split_advance(RESET, s), pcgs)
            else:
                each(lambda p: p.split_advance(STEP, s), pcgs)
            each(lambda p: p.split_direction(s), pcgs)
            i += 1
    return pcgs[0].split_result(ended, q_tolerance)
