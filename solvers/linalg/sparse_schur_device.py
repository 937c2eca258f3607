"""sparse_schur for the device-resident Levenberg-Marquardt (:mod:`solvers.ba.lm_device`): the
reduced camera system assembled on the device (:mod:`solvers.linalg.schur_reduced_device`) and factorised
where that is fastest:

- on the device, by a dense Cholesky (:mod:`solvers.linalg.dense_cholesky_device`), while the dense matrix fits
  (a fraction of the memory the rest of the solve leaves, one allocation) and is no larger than
  ``factorisation_limits.DEVICE_DENSE_MAX`` unknowns, on GPUs and other accelerators. Nothing crosses to the host
  but a failure flag. With mixed-precision solves (``mixed``: ``Options.mixed_precision_solves``),
  the factorisation is float32's and the solution is refined
  in float64 to the float64 factorisation's accuracy (:mod:`solvers.linalg.mixed_cholesky_device`;
  the float64 factorisation takes over where the refinement stalls); the residuals then cross
  to the host, a vector per step.
- otherwise on the host, from S's nonzero blocks read back (:mod:`solvers.linalg.host_cholesky`): the
  dense LAPACK Cholesky up to ``factorisation_limits.HOST_DENSE_MAX`` unknowns (the host path's choice, and the
  fastest there on the BAL problems) or further where S is nearly full (a COLMAP scene's), the
  best sparse Cholesky installed above (CHOLMOD).

With merged groups that share a camera (:mod:`solvers.general.merged_groups`), the cameras are keys whose
columns copy the problem's (:class:`solvers.general.key_copies_device.KeyCopies`): the keys' dense matrix is
assembled, summed into the problem's columns, and factorised on the device, or, on CPUs, by LAPACK
on the host; the solution goes back into every copy.

On a CPU device the "device" is the host's own cores: PoCL's dense Cholesky measured 3-8x slower
than LAPACK and 1.1-1.8x slower than CHOLMOD on the same two cores (README), so CPU devices
factorise on the host. The choice is made once per solve and said in :attr:`description`.
Results and messages are those of :meth:`solvers.ba.schur.NormalEquations.solve`'s sparse_schur.
"""
from __future__ import annotations

import numpy as np
import pyopencl as cl

from clkernels import arrays
from clkernels.launch import release_kernels

from . import factorisation_limits as limits, host_cholesky
from .dense_cholesky_device import DenseCholesky, block_sizes, dense_bytes, device_small_solve_max, padded_size
from .mixed_cholesky_device import MixedCholesky, choose_mixed
from .schur_reduced_device import MAX_RUN_CPU, MAX_RUN_GPU, ReducedCameraSystem, ReducedPattern


NOT_FINITE, NOT_POSITIVE_DEFINITE = 1, 2      # flag bits (schur_reduced_device / dense_cholesky_device templates)
MSG_NOT_FINITE = "Linear solver failure: non-finite reduced camera matrix."
MSG_NOT_PD = "Linear solver failure: the reduced camera matrix is not positive definite."


def choose_factorisation(info, n_unknowns: int, other_bytes: int, fill: float = 0.0, dense: bool = False) -> str:
    """``"device"`` or the name of the host factoriser (:data:`host_cholesky.LABELS`). ``fill``:
    the fraction of S's blocks that are nonzero; a matrix that is nearly full (cameras that all
    see the same points, as a COLMAP scene's) factorises faster dense on the host at any size up
    to ``factorisation_limits.DENSE_FILL_MAX`` (a sparse factorisation of it measured 5-15x slower).
    ``dense``: never a sparse factorisation (the device's dense Cholesky where it fits, else
    LAPACK's)."""
    limit = limits.DEVICE_DENSE_MAX_CPU if info.is_cpu else limits.DEVICE_DENSE_MAX
    nb, _ = block_sizes(info)
    need = dense_bytes(n_unknowns, nb, small_solve_max=device_small_solve_max(info))
    matrix = 8 * padded_size(n_unknowns, nb) ** 2
    fits = (matrix <= info.max_alloc_bytes
            and need <= limits.DENSE_MEMORY_FRACTION * max(0, info.global_mem_bytes - other_bytes))
    if n_unknowns <= limit and fits:
        return "device"
    if limits.host_dense(n_unknowns, fill, forced=dense):
        return "lapack"
    return host_cholesky.best_sparse()


class DeviceSparseSchur:
    """One solve's sparse_schur linear systems on the device (built once per solve: the block
    structure does not change). :meth:`solve` per linear system."""

    def __init__(self, runtime, cam, pt, num_cameras, num_points, C=9, P=3, R=2, other_bytes=0, events=None,
                 camera_order=None, copies=None, pattern=None, dense=False, device_observations=None,
                 mixed=None):
        """``pattern``: the :class:`ReducedPattern` of these arguments where the caller has it
        (made with the device's run length); ``dense``: factorised dense at any size
        (:func:`choose_factorisation`). ``device_observations``: the observations ordered on the
        device (:class:`solvers.ba.observations_device.DeviceObservations`; ``cam``, ``pt`` and
        ``camera_order`` may then be None): the pattern is made there
        (:mod:`solvers.linalg.schur_pattern_device`), else from their host copies. ``mixed``:
        mixed-precision solves on the device (:func:`~solvers.linalg.mixed_cholesky_device.choose_mixed`;
        None chooses)."""
        self.rt, self.C, self.copies = runtime, C, copies
        info = runtime.info
        max_run = MAX_RUN_CPU if info.is_cpu else MAX_RUN_GPU
        if pattern is not None and pattern.max_run != max_run:
            pattern = None
        dev = device_observations
        if pattern is None and dev is not None:
            from .schur_pattern_device import pattern_on_device
            pattern = pattern_on_device(runtime, dev, max_run, other_bytes)
        if pattern is None:
            if dev is not None:         # (the device could not make it: its host copies)
                cam, pt, camera_order = dev.host("cam"), dev.host("pt"), dev.host("camera_order")
            pattern = ReducedPattern(cam, pt, num_cameras, num_points, max_run=max_run, camera_order=camera_order)
        self.pattern = pat = pattern
        self.system = ReducedCameraSystem(runtime, pat, C, P, R)
        self.system.events = events
        self.n = n = C * pat.nc if copies is None else copies.nf
        self.where = choose_factorisation(info, n, other_bytes + self.system.nbytes, pat.fill, dense)
        self.bytes_to_host = self.bytes_to_device = 0
        if copies is not None:
            # The keys' matrix (the blocks outside the pattern stay zero) and right-hand side.
            nv = self.nv = C * pat.nc
            self.A_keys = arrays.zeros(runtime, max(1, nv * nv), np.float64)
            self.rhs_keys = arrays.scratch(runtime, max(1, nv), np.float64)
            self.y = arrays.scratch(runtime, max(1, n), np.float64)
            if self.where != "device":
                self.where = "lapack"                   # the problem's matrix is dense
        if copies is not None and self.where != "device":
            self.dense = None
            self.S = arrays.scratch(runtime, max(1, n * n), np.float64)
            self.rhs = arrays.scratch(runtime, max(1, n), np.float64)
            self.flag = arrays.scratch(runtime, 1, np.int32)
            how = "dense Cholesky (LAPACK) on the host"
        elif self.where == "device":
            if choose_mixed(info, n, other_bytes + self.system.nbytes, mixed):
                self.dense = MixedCholesky(runtime, n)
                how = "dense Cholesky on the device (float32, refined in float64)"
            else:
                self.dense = DenseCholesky(runtime, n)
                how = "dense Cholesky on the device"
            self._flag = np.zeros(1, np.int32)      # the factorisation's flag, read back into it
            self.dense.events = events
        else:
            self.dense = None
            self.blocks = arrays.scratch(runtime, max(1, pat.nblocks * C * C), np.float64)
            self.rhs = arrays.scratch(runtime, max(1, n), np.float64)
            self.flag = arrays.scratch(runtime, 1, np.int32)   # the kernels' flag; the host tests the values
            self.host = host_cholesky.make_factoriser(pat.block_row, pat.block_col, pat.nc, C, self.where)
            total = pat.nc * (pat.nc + 1) // 2
            how = (f"{pat.nblocks} of {total} blocks nonzero, "
                   f"{host_cholesky.LABELS[self.where]} on the host")
        if copies is not None:
            self.description = (f"Reduced camera matrix: {n} x {n}, summed from the keys' {self.nv} x {self.nv} "
                                f"on the device, {how}")
        else:
            self.description = f"Reduced camera matrix: {n} x {n}, {how}"
        self._check_memory(other_bytes)
        # On the Oclgrind simulator these buffers outlive the solve: released, their shadows would
        # be reused at their old sizes by the next solve's buffers (see arrays.keep_on_simulator).
        arrays.keep_on_simulator(runtime, self)

    @staticmethod
    def program_requests(runtime, C, P, R, num_cameras, other_bytes=0, dense=False, device_setup=False,
                         mixed=None):
        """The programs a system of ``num_cameras`` cameras builds, for
        :func:`clkernels.templates.prefetch`: the assembly's, and the dense output with the device's
        Cholesky where the matrix would be factorised there, else the blocks' (the pattern's fill,
        made later, can move a factorisation from LAPACK to CHOLMOD, never onto the device);
        ``device_setup``: the pattern's own (made on the device from device observations);
        ``mixed``: as the constructor's."""
        n = C * num_cameras
        on_device = choose_factorisation(runtime.info, n, other_bytes, 0.0, dense) == "device"
        out = "dense" if on_device else "blocks"
        reduced = [ReducedCameraSystem.program_request(runtime, C, P, R, o) for o in (None, out)]
        if device_setup:
            from .schur_pattern_device import program_request
            reduced.append(program_request())
        if not on_device:
            return reduced
        if choose_mixed(runtime.info, n, other_bytes, mixed):
            return reduced + MixedCholesky.program_requests(runtime)
        return reduced + [DenseCholesky.program_request(runtime)]

    def close(self):
        """The solve is over: the kernel objects go back to their pools (launch.release_kernels)."""
        release_kernels(self.system)
        if self.dense is not None:
            self.dense.release()

    @property
    def nbytes(self) -> int:
        if self.copies is not None:
            # The keys' matrix, and the copies' sums by column (nv x n) that compress makes.
            keys = self.A_keys.nbytes + self.rhs_keys.nbytes + self.y.nbytes + self.copies.nbytes \
                + 8 * self.nv * self.n
            factor = self.dense.nbytes if self.dense is not None else self.S.nbytes + self.rhs.nbytes + 4
            return self.system.nbytes + keys + factor
        if self.dense is not None:
            return self.system.nbytes + self.dense.nbytes
        return self.system.nbytes + self.blocks.nbytes + self.rhs.nbytes + 4

    def _check_memory(self, other_bytes):
        from clkernels.memory import DeviceMemoryError, available
        need = other_bytes + self.nbytes
        have, limited_by = available(self.rt.info)      # on a CPU device, the host's memory too
        if need > have:
            raise DeviceMemoryError(
                f"this problem's sparse_schur solve needs about {need / 2**30:.2f} GiB ({need} bytes) on "
                f"{self.rt.info.name!r} (limited by {limited_by}), which has {have / 2**30:.2f} GiB; "
                + ("mixed_precision_solves=False (its float32 copy of the matrix is part of that), "
                   if isinstance(self.dense, MixedCholesky) else "")
                + "use iterative_schur, a device with more memory, or device_resident=False (the host path)",
                need, have)

    def solve(self, Jc, Jp, Vinv, B, dc2, gc, gp, x, defer=False):
        """Solve ``S yc = gc - W V^-1 gp`` for the device arrays of the normal equations (see
        :class:`ReducedCameraSystem`); ``yc`` into the device array ``x`` (nc * C).
        Returns ``(ok, message)``. ``defer=True``: when S is factorised on the device, its
        failure flag comes back without a wait, and ``ok`` is None: :meth:`outcome` says, once
        the caller has waited for the queue past this solve (a blocking read after it)."""
        if self.n == 0:
            if self.copies is not None and self.nv:
                self.copies.to_copies(self.y, x)          # every camera entry constant: zeros
            return True, "Success."
        if self.copies is not None:
            return self._solve_copies(Jc, Jp, Vinv, B, dc2, gc, gp, x, defer)
        if self.dense is not None:
            return self._solve_on_device(Jc, Jp, Vinv, B, dc2, gc, gp, x, defer)
        return self._solve_on_host(Jc, Jp, Vinv, B, dc2, gc, gp, x)

    def _solve_on_device(self, Jc, Jp, Vinv, B, dc2, gc, gp, x, defer):
        d, sys_ = self.dense, self.system
        d.clear()
        sys_.enqueue_groups(Jc, Jp, Vinv)
        sys_.enqueue_rhs(gc, gp, d.b, d.flag)
        sys_.enqueue_dense(B, dc2, d.A, d.m, d.flag)
        d.factor()
        self._solve_dense(x)
        cl.enqueue_copy(self.rt.queue, self._flag, d.flag.data, is_blocking=not defer)
        self.bytes_to_host += self._flag.nbytes
        if defer:
            return None, "Success."
        return self.outcome()

    def _solve_copies(self, Jc, Jp, Vinv, B, dc2, gc, gp, x, defer):
        """The keys' system summed into the problem's columns (module docstring); ``dc2`` is on
        one copy of each column (lm_device.cl.mako's camera_regularize with COPIES)."""
        q, sys_, cp, d = self.rt.queue, self.system, self.copies, self.dense
        flag = d.flag if d is not None else self.flag
        if d is not None:
            d.clear()
        sys_.enqueue_groups(Jc, Jp, Vinv)
        sys_.enqueue_rhs(gc, gp, self.rhs_keys, flag)
        sys_.enqueue_dense(B, dc2, self.A_keys, self.nv, flag)
        if d is not None:
            # The lower triangle (A holds S itself: sign -1), the right-hand side into b's first n.
            cp.compress(self.A_keys, d.A, d.m, lower=True, sign=-1.0)
            cp.to_columns(self.rhs_keys, d.b)
            d.factor()
            self._solve_dense(self.y)
            cp.to_copies(self.y, x)
            cl.enqueue_copy(q, self._flag, d.flag.data, is_blocking=not defer)
            self.bytes_to_host += self._flag.nbytes
            return (None, "Success.") if defer else self.outcome()
        n = self.n
        cp.compress(self.A_keys, self.S, n, lower=False, sign=-1.0)
        cp.to_columns(self.rhs_keys, self.rhs)
        S, rhs = np.empty((n, n)), np.empty(n)
        cl.enqueue_copy(q, S, self.S.data, is_blocking=False)
        cl.enqueue_copy(q, rhs, self.rhs.data)
        self.bytes_to_host += S.nbytes + rhs.nbytes
        if not (np.all(np.isfinite(S)) and np.all(np.isfinite(rhs))):
            return False, MSG_NOT_FINITE
        try:
            c = host_cholesky.lapack_cholesky(S, overwrite=True)
        except host_cholesky.NotPositiveDefinite:
            return False, MSG_NOT_PD
        y = np.ascontiguousarray(host_cholesky.lapack_solve(c, rhs))
        cl.enqueue_copy(q, self.y.data, y)
        self.bytes_to_device += y.nbytes
        cp.to_copies(self.y, x)
        return True, "Success."

    def _solve_dense(self, x):
        """The dense factor's solve into ``x``; a mixed-precision one's reads counted."""
        before = getattr(self.dense, "bytes_to_host", 0)
        self.dense.solve(x)
        self.bytes_to_host += getattr(self.dense, "bytes_to_host", 0) - before

    def outcome(self):
        """``(ok, message)`` of the last device solve, from its flag (read by then)."""
        flag = self._flag[0]
        # The host path tests the matrix for non-finite entries before it factorises.
        if flag & NOT_FINITE:
            return False, MSG_NOT_FINITE
        if flag & NOT_POSITIVE_DEFINITE:
            return False, MSG_NOT_PD
        return True, "Success."

    def _solve_on_host(self, Jc, Jp, Vinv, B, dc2, gc, gp, x):
        q, sys_ = self.rt.queue, self.system
        sys_.enqueue_groups(Jc, Jp, Vinv)
        sys_.enqueue_rhs(gc, gp, self.rhs, self.flag)
        sys_.enqueue_blocks(B, dc2, self.blocks, self.flag)
        blocks = np.empty(self.pattern.nblocks * self.C * self.C)
        rhs = np.empty(self.n)
        cl.enqueue_copy(q, blocks, self.blocks.data, is_blocking=False)
        cl.enqueue_copy(q, rhs, self.rhs.data)
        self.bytes_to_host += blocks.nbytes + rhs.nbytes
        if not (np.all(np.isfinite(blocks)) and np.all(np.isfinite(rhs))):
            return False, MSG_NOT_FINITE
        try:
            self.host.factor(blocks)
        except host_cholesky.NotPositiveDefinite:
            return False, MSG_NOT_PD
        y = np.ascontiguousarray(self.host.solve(rhs))
        cl.enqueue_copy(q, x.data, y)
        self.bytes_to_device += y.nbytes
        return True, "Success."
