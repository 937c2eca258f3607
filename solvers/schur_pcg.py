"""Launcher of ``schur_pcg.cl.mako``: iterative_schur's preconditioned conjugate gradients run
entirely on the OpenCL device, on the implicit Schur complement.

The host version (:func:`solvers.cg.conjugate_gradients` with a matrix-free product) waits for
the device once per CG iteration; at a few tens of thousands of observations that wait, not the
arithmetic, is most of the time. Here one iteration is three kernel enqueues with nothing read
back: the host enqueues a few iterations ahead, reads the 6-number state every ``CHECK_EVERY``
iterations, and the kernels do nothing once the state says the solve has ended. Same algorithm,
termination tests, iteration counts and messages as ``conjugate_gradients`` (Ceres'
``ConjugateGradientsSolver``); only the order of the floating-point sums differs.
"""
from __future__ import annotations

import collections

import numpy as np
import pyopencl as cl

from clkernels import arrays
from clkernels.templates import get_program

from . import host_memory, ordering

TEMPLATE = "solvers/schur_pcg.cl.mako"
# Longest run of one camera's observations one work-item of camera_partials sums: cameras seen
# thousands of times spread over many work-items, whose partial sums cg_update adds. Short on
# GPUs, which need many work-items and whose loop iterations are slow; long on CPUs, where the
# work-items run one after another anyway and cg_update's sum over the partials is serial.
MAX_SEGMENT_CPU = 256
MAX_SEGMENT_GPU = 16
# Iterations enqueued between two reads of the state (the reads overlap the next batch).
CHECK_EVERY = 4
RESIDUAL_RESET_PERIOD = 10

# State slots and statuses (the #defines of the template).
S_STATUS, S_ITER, S_RHO, S_Q0, S_TOL_R, S_VALUE = range(6)
RUNNING, B_ZERO, R_SMALL, ZETA, MAX_ITER, INDEFINITE = 0, 1, 2, 3, 4, 5
FAIL_RHO, FAIL_BETA, FAIL_ALPHA = -1, -2, -3
START, STEP, STEP_NO_R, RESET = 0, 1, 2, 3


def _camera_segments(cam, pt, nc, max_len, order=None):
    """Observations in camera order (point order within a camera) cut into runs of about
    ``max_len`` of one camera, never inside one camera-point group (jacobi_blocks sums a group
    before its product). Returns the observation order, the runs' starts (nseg + 1; a run may be
    empty) and each camera's first run (nc + 1). ``order``, when given, is that observation order
    already (``np.argsort(cam, kind="stable")``, as ``Evaluator.camera_order`` has it)."""
    if order is None:
        order = ordering.stable_order(cam, nc)              # stable: point order within a camera
    counts = ordering.counts(cam, nc)
    first_obs = np.concatenate(([0], np.cumsum(counts)))
    pieces = -(-counts // max_len)                       # a camera without observations: none
    cam_seg = np.concatenate(([0], np.cumsum(pieces)))
    owner = np.repeat(np.arange(nc), pieces)
    k = np.arange(owner.size) - cam_seg[owner]
    want = first_obs[owner] + k * max_len
    # A group starts where a camera starts or the point changes within one. Cuts almost always
    # fall on a group's start; only when one does not is every group start needed.
    inner = np.flatnonzero(k > 0)
    at = want[inner]
    if not np.any(np.take(pt, np.take(order, at)) == np.take(pt, np.take(order, at - 1))):
        return order, np.concatenate((want, [cam.size])), cam_seg
    group_start = ordering.changes(pt, order)
    group_start[first_obs[:-1][counts > 0]] = True
    start = np.minimum(ordering.next_true(group_start, want), first_obs[owner + 1])
    return order, np.concatenate((start, [cam.size])), cam_seg


class DevicePCG:
    """The device buffers, index arrays and kernels of one problem's iterative_schur solves.

    Built once per solve (the structure does not change); :meth:`bind_jacobian` after every new
    Jacobian, :meth:`solve` for every linear system."""

    def __init__(self, runtime, cam, pt, num_cameras, num_points, camera_order=None):
        self.rt = rt = runtime
        cam, pt = np.asarray(cam), np.asarray(pt)      # int32 from the Evaluator: no copies
        n, nc, npt = cam.size, int(num_cameras), int(num_points)
        if max(n, 9 * nc, 9 * npt) >= 2 ** 31:
            raise ValueError("the device CG indexes with 32-bit ints: problem too large")
        self.n, self.nc, self.npt = n, nc, npt
        max_segment = MAX_SEGMENT_CPU if runtime.info.is_cpu else MAX_SEGMENT_GPU
        order, seg_start, cam_seg = _camera_segments(cam, pt, nc, max_segment, camera_order)
        self.nseg = seg_start.size - 1
        pt_start = ordering.starts(pt, npt)              # pt is sorted: counts, not searches
        # Index arrays the kernels only read: over the host arrays on a CPU device, else copies.
        i32 = lambda a: host_memory.read_only(rt, np.ascontiguousarray(a, dtype=np.int32))  # noqa: E731
        self.cam, self.pt, self.pt_start = i32(cam), i32(pt), i32(pt_start)
        # Cameras with observations and their first runs: where jacobi_sums' partials go.
        self._seen_cams = np.flatnonzero(np.diff(cam_seg) > 0)
        self._seen_first_run = cam_seg[self._seen_cams]
        self.obs, self.seg_start, self.cam_seg = i32(order), i32(seg_start), i32(cam_seg)
        # scratch: written by kernels and read by later ones (see arrays.scratch on the simulator)
        f64 = lambda shape: arrays.scratch(rt, shape, np.float64)  # noqa: E731
        self.w, self.partial = f64(max(1, 2 * n)), f64(max(1, 9 * self.nseg))
        self.b, self.x, self.r, self.p, self.z, self.q, self.dc2 = (f64(max(1, 9 * nc)) for _ in range(7))
        self.Vinv, self.Pinv = f64(max(1, 9 * npt)), f64(max(1, 81 * nc))
        self.gp, self.yc, self.yp = f64(max(1, 3 * npt)), f64(max(1, 9 * nc)), f64(max(1, 3 * npt))
        self.blocks = f64(max(1, 45 * self.nseg))
        self._vinv_for = None       # the host V^-1 whose copy self.Vinv holds
        self.state = f64(8)
        # cg_update's single work-group: wide on GPUs (its loops run over the cameras), one
        # item per core's SIMD lanes' worth on CPUs, where a group runs on one thread anyway.
        self.L = arrays.work_group_size(rt, None, 16 if rt.info.is_cpu else 256)
        prg = get_program(TEMPLATE, rt, L=self.L)
        # Kernel objects of this instance alone: their arguments are set once here, and only
        # the launch mode and iteration change per enqueue (templates.kernel's shared objects
        # would let two solves overwrite each other's arguments).
        self.k_project = cl.Kernel(prg, "project_points")
        self.k_partials = cl.Kernel(prg, "camera_partials")
        self.k_update = cl.Kernel(prg, "cg_update")
        self.k_jacobi = cl.Kernel(prg, "jacobi_blocks")
        self.k_back = cl.Kernel(prg, "back_substitute")
        # Small groups on CPUs: PoCL runs a group per core at a time, and a few hundred segments
        # in groups of 64 leave one core idle at the end (8 was a third faster for the partials).
        ls = 8 if rt.info.is_cpu else 64
        self.ls_points = arrays.work_group_size(rt, self.k_project, ls)
        self.ls_partials = arrays.work_group_size(rt, self.k_partials, ls)
        self.gs_points = arrays.round_up(max(1, npt), self.ls_points)
        self.gs_partials = arrays.round_up(max(1, self.nseg), self.ls_partials)
        self.k_partials.set_args(None, self.w.data, self.obs.data, self.seg_start.data,
                                 self.partial.data, self.state.data, np.int32(self.nseg))
        self.k_update.set_args(self.partial.data, self.cam_seg.data, self.dc2.data, self.Pinv.data,
                               self.b.data, self.x.data, self.r.data, self.p.data, self.z.data,
                               self.q.data, self.state.data, np.int32(nc), np.int32(START),
                               np.int32(0), np.int32(0), np.float64(0), np.float64(0))
        self._jacobian = None
        # Kernel events of the solves (for a profile; None: not kept) and bytes read back.
        self.events = None
        self.bytes_to_host = self.bytes_to_device = 0

    def bind_jacobian(self, Jc_dev, Jp_dev, r_dev):
        """The device Jacobian blocks (n, 2, 9), (n, 2, 3) and residuals (n * 2) of the linear
        systems to come (kept referenced while bound); nothing to do when they are bound already."""
        if self._jacobian is not None and all(a is b for a, b in zip(self._jacobian, (Jc_dev, Jp_dev, r_dev))):
            return
        for a, shape in ((Jc_dev, (self.n, 2, 9)), (Jp_dev, (self.n, 2, 3))):
            if a.dtype != np.float64 or a.size != int(np.prod(shape)):
                raise ValueError(f"expected float64 device blocks of shape {shape}, got {a.shape} {a.dtype}")
        if r_dev.dtype != np.float64 or r_dev.size != 2 * self.n:
            raise ValueError(f"expected {2 * self.n} float64 residuals, got {r_dev.shape} {r_dev.dtype}")
        self._jacobian = (Jc_dev, Jp_dev, r_dev)
        self.k_project.set_args(Jc_dev.data, Jp_dev.data, self.cam.data, self.pt_start.data,
                                self.Vinv.data, r_dev.data, self.w.data, self.state.data,
                                np.int32(self.npt), np.int32(1))
        self.k_partials.set_arg(0, Jc_dev.data)
        self.k_jacobi.set_args(Jc_dev.data, Jp_dev.data, self.obs.data, self.pt.data, self.seg_start.data,
                               self.Vinv.data, self.blocks.data, np.int32(self.nseg))
        self.k_back.set_args(Jc_dev.data, Jp_dev.data, self.cam.data, self.pt_start.data, self.Vinv.data,
                             self.gp.data, self.yc.data, self.yp.data, np.int32(self.npt))
        self._vinv_for = None

    def unbind_jacobian(self):
        """Forget the bound Jacobian (its memory can go before the next one is made)."""
        self._jacobian = None

    def _upload_vinv(self, Vinv, pending):
        """Copy ``Vinv`` (npt, 3, 3) to the device unless this very array is there already."""
        if self._vinv_for is not Vinv:
            arrays.write_async(self.rt, self.Vinv, Vinv, pending)
            self._vinv_for = Vinv

    def jacobi_sums(self, Vinv):
        """Per camera, ``sum over its points of G V^-1 G^T`` (nc, 9, 9): what the pairs subtract
        from ``B + Dc^2`` in S's diagonal blocks (the Schur-Jacobi preconditioner)."""
        self._check_bound()
        q, pending = self.rt.queue, []
        self._upload_vinv(Vinv, pending)
        out = np.zeros((self.nc, 9, 9))
        if not self.nseg:
            return out
        cl.enqueue_nd_range_kernel(q, self.k_jacobi, (self.gs_partials,), (self.ls_partials,))
        part = np.empty((self.nseg, 45))
        cl.enqueue_copy(q, part, self.blocks.data)
        tri = np.add.reduceat(part, self._seen_first_run, axis=0)   # (cameras seen, 45)
        rows, cols = np.triu_indices(9)
        out[self._seen_cams[:, None], rows, cols] = tri
        out[self._seen_cams[:, None], cols, rows] = tri
        return out

    def back_substitute(self, Vinv, gp, yc):
        """The points' step ``V^-1 (gp - W^T yc)`` per point (npt, 3), on the device."""
        self._check_bound()
        q, pending = self.rt.queue, []
        self._upload_vinv(Vinv, pending)
        arrays.write_async(self.rt, self.gp, gp, pending)
        arrays.write_async(self.rt, self.yc, yc, pending)
        yp = np.zeros((self.npt, 3))
        if self.npt:
            cl.enqueue_nd_range_kernel(q, self.k_back, (self.gs_points,), (self.ls_points,))
            cl.enqueue_copy(q, yp, self.yp.data)
        return yp

    def _check_bound(self):
        if self._jacobian is None:
            raise RuntimeError("bind_jacobian() before solve()")

    def _apply(self, v, from_residuals=False):
        """Enqueue ``w = (I - E V^-1 E^T) t`` per observation (t = F v, or f) and its camera sums."""
        q = self.rt.queue
        self.k_project.set_arg(5, v)
        self.k_project.set_arg(9, np.int32(1 if from_residuals else 0))
        if self.npt:
            self._record("project_points", cl.enqueue_nd_range_kernel(q, self.k_project, (self.gs_points,),
                                                                      (self.ls_points,)))
        if self.nseg:
            self._record("camera_partials_cg", cl.enqueue_nd_range_kernel(q, self.k_partials, (self.gs_partials,),
                                                                          (self.ls_partials,)))

    def _update(self, mode, it):
        self.k_update.set_arg(12, np.int32(mode))
        self.k_update.set_arg(13, np.int32(it))
        self._record("cg_update", cl.enqueue_nd_range_kernel(self.rt.queue, self.k_update, (self.L,), (self.L,)))

    def solve(self, Vinv, Dc2, Pinv, q_tolerance=0.1, r_tolerance=-1.0, max_iterations=500):
        """PCG from ``x = 0`` on ``S = F^T (I - E V^-1 E^T) F + diag(Dc2)`` with right-hand side
        ``F^T (f - E V^-1 E^T f)`` and preconditioner blocks ``Pinv`` (nc, 9, 9), all host arrays.
        Returns ``(x (nc * 9) or None, ok, iterations, message)`` as ``conjugate_gradients`` does."""
        self._check_bound()
        # Non-blocking uploads: their events (kept until the solve has waited on the queue)
        # hold the host arrays.
        uploads = []
        self._upload_vinv(Vinv, uploads)
        for dev, host in ((self.dc2, Dc2), (self.Pinv, Pinv)):
            arrays.write_async(self.rt, dev, host, uploads)
        try:
            return self.run(q_tolerance, r_tolerance, max_iterations)
        finally:
            for event in uploads:
                event.wait()

    def device_inputs_written(self):
        """``Vinv``, ``dc2`` and ``Pinv`` were written on the device (solvers.lm_device): no host
        copy of V^-1 is current any more."""
        self._vinv_for = None

    def run(self, q_tolerance=0.1, r_tolerance=-1.0, max_iterations=500, read_x=True):
        """The PCG of :meth:`solve` on what ``self.Vinv``, ``self.dc2`` and ``self.Pinv`` hold on the
        device. With ``read_x=False`` the solution stays in ``self.x`` (x is None in the result)."""
        self._check_bound()
        q = self.rt.queue
        max_iterations = max(1, int(max_iterations))
        uploads = []
        arrays.write_async(self.rt, self.state, np.zeros(8), uploads)       # state: all RUNNING
        self.bytes_to_device += 64
        self.k_update.set_arg(14, np.int32(max_iterations))
        self.k_update.set_arg(15, np.float64(q_tolerance))
        self.k_update.set_arg(16, np.float64(r_tolerance))
        self._apply(self._jacobian[2].data, from_residuals=True)
        self._update(START, 0)
        # Batches of CHECK_EVERY iterations, each followed by a non-blocking read of the state;
        # the host looks at a batch's state only once the next batch is queued, so the device
        # never idles while the host decides. The last iteration always ends the solve.
        reads, it, state = collections.deque(), 1, None
        try:
            while state is None:
                if it <= max_iterations:
                    stop = min(max_iterations, it + CHECK_EVERY - 1)
                    for i in range(it, stop + 1):
                        self._apply(self.p.data)
                        if i % RESIDUAL_RESET_PERIOD == 0:      # r = b - S x, as Ceres does
                            self._update(STEP_NO_R, i)
                            self._apply(self.x.data)
                            self._update(RESET, i)
                        else:
                            self._update(STEP, i)
                    it = stop + 1
                    host = np.empty(8)
                    reads.append((host, cl.enqueue_copy(q, host, self.state.data, is_blocking=False)))
                    self.bytes_to_host += host.nbytes
                    if len(reads) < 2 and it <= max_iterations:
                        continue
                if not reads:
                    raise RuntimeError("device CG ended without a termination state")
                host, event = reads.popleft()
                event.wait()
                if host[S_STATUS] != RUNNING:
                    state = host
        finally:
            for _, event in reads:   # the reads write into host arrays: let them land first
                event.wait()
            for event in uploads:
                event.wait()
        return self._result(state, q_tolerance, read_x)

    def jacobi_blocks(self):
        """Enqueue ``jacobi_blocks`` into ``self.blocks`` (nseg, 45) from the device ``self.Vinv``."""
        self._check_bound()
        if self.nseg:
            self._record("jacobi_blocks", cl.enqueue_nd_range_kernel(
                self.rt.queue, self.k_jacobi, (self.gs_partials,), (self.ls_partials,)))
        return self.blocks

    def back_substitute_solution(self):
        """Enqueue the points' step ``V^-1 (gp - W^T x)`` for the CG solution ``self.x`` and what
        ``self.gp`` holds on the device, into ``self.yp``; returns ``self.yp``."""
        self._check_bound()
        if self.npt:
            if self.nc:
                cl.enqueue_copy(self.rt.queue, self.yc.data, self.x.data, byte_count=self.x.nbytes)
            self._record("back_substitute", cl.enqueue_nd_range_kernel(
                self.rt.queue, self.k_back, (self.gs_points,), (self.ls_points,)))
        return self.yp

    def _record(self, name, event):
        if self.events is not None:
            self.events.append((name, event))

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
        x = np.zeros(9 * self.nc)
        if status != B_ZERO and x.size:
            cl.enqueue_copy(self.rt.queue, x, self.x.data)
        return x, True, its, msg
