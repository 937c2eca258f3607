"""Levenberg-Marquardt's iterations with everything per iteration on the OpenCL device.

:class:`DeviceState` has the methods of :class:`solvers.ba.host_state.HostState` (the reference) and
keeps every vector and block on the device:

- the camera model (a pyclad ``BatchFunction``) writes residuals and Jacobian blocks straight into
  device arrays, observations sorted by point (the layout the Schur kernels read);
- ``lm_device.cl.mako`` does the robust-loss correction, the normal equations' blocks and the
  gradient, Jacobi scaling, the LM diagonal, ``V^-1``, the Schur-Jacobi preconditioner, the step,
  ``J step`` with the model cost change, the candidate point and its cost, and the norms;
- ``schur_pcg_device.cl.mako`` (:class:`solvers.linalg.schur_pcg_device.DevicePCG`) does the conjugate gradients and the
  back-substitution;
- for sparse_schur, :class:`solvers.linalg.sparse_schur_device.DeviceSparseSchur` assembles the reduced
  camera system and factorises it (on the device, or on the host from its blocks).

Per iteration the host reads a handful of scalars (costs, norms, the CG state, whether a
preconditioner block failed); the parameters come back only at the end (:meth:`best`).
Block sizes (camera C, point P, residual R) are the model's and render parameters of the template.
"""
from __future__ import annotations

import time
import numpy as np
import pyopencl as cl

from clkernels import arrays
# DeviceMemoryError: the problem does not fit in the device's memory (on a CPU device, the
# host's). One class with clkernels' (the launch layer raises it too), also named here.
from clkernels.memory import DeviceMemoryError, available as available_memory  # noqa: F401
from clkernels.launch import presets, release_kernels
from clkernels.templates import ctype, get_program, prefetch, template_request

from ..loop.step import LoopState, StepSolution
from ..linalg.linear_solver import linear_solver

TEMPLATE = "solvers/ba/lm_device.cl.mako"
# scalars[]: pairs written by the reductions' finish kernel.
COST, GRADIENT, STEP, CHANGE, NORM, CANDIDATE = 0, 2, 4, 6, 8, 10
N_SCALARS = 12


def device_bytes(n_obs: int, n_cameras: int, n_points: int, C: int = 9, P: int = 3, R: int = 2,
                 dtype=np.float64) -> int:
    """Bytes of device memory a device-resident solve allocates at its peak, with Jacobians and
    vectors stored in ``dtype`` (sums in float64)."""
    T = C * (C + 1) // 2
    b = np.dtype(dtype).itemsize
    per_obs = b * (R * (C + P)        # Jacobian blocks
                   + R * C            # the camera blocks in camera order (the CG's GPU layout)
                   + 2 * R            # residuals, and the candidate's
                   + R                # the CG's per-observation product
                   + R)               # observed values
    per_obs += 8                      # per-observation terms of the reductions
    per_obs += 4 * (2 + 3)            # evaluation index; CG's camera, point, camera-order index
    per_cam = b * (15 * C + T + 2 * C * C) + 8 * (2 * T + C) + 4 * 3
    per_pt = b * (9 * P + 2 * P * P) + 4
    return int(n_obs * per_obs + n_cameras * per_cam + n_points * per_pt + (1 << 20))


PARTS = ("-D LM_PARTS=1", "-D LM_PARTS=2", "-D LM_PARTS=4")    # the template's three parts (its LM_PARTS)


def program_requests(rt, C, P, R, loss: str, dtype, blocks: tuple, copies: bool):
    """The iterations' programs, one per part of the template (:class:`DeviceState` builds
    exactly these), for :func:`clkernels.templates.prefetch`. ``L``: the reductions' work-group size."""
    from ..linalg.schur_pcg_device import accumulator_dtype
    params = dict(C=C, P=P, R=R, L=arrays.work_group_size(rt, None, 64 if rt.info.is_cpu else 256), LOSS=loss,
                  REAL=ctype(dtype), ACC=ctype(accumulator_dtype(rt)), BLOCKS=blocks, COPIES=copies)
    return [template_request(TEMPLATE, (part,), **params) for part in PARTS]


def larger_problem_requests(rt, options, dtype, entry, C, P, R) -> list:
    """The programs that a larger problem of this kind adds on an accelerator (none on CPU
    devices, whose paths do not change with size): the device setup's, from
    ``observations_device.MIN_OBSERVATIONS`` observations, and for sparse_schur the factorisation
    of a reduced camera matrix of ``MIXED_MIN_UNKNOWNS`` unknowns (mixed precision by default).

    Prefetched behind a cold solve's own programs, so that the build workers put them in the
    binary cache while small problems are solved, and the first large problem of the process (or
    of a later one) loads them instead of compiling them: at venice size on the H100 that compile
    was 0.8 s of a 1.8 s first solve (four programs, the sort's and the pattern's), against 0.99 s
    for the next solve. ``python -m clkernels warmup`` builds them too."""
    from clkernels import simulator
    from ..linalg.mixed_cholesky_device import MIXED_MIN_UNKNOWNS
    from . import observations_device as dobs
    if simulator.cpu_like(rt.info):
        return []
    setup = options.device_resident is not False and dobs.wanted(rt, dobs.MIN_OBSERVATIONS, options.device_setup)
    cameras = -(-MIXED_MIN_UNKNOWNS // C)
    return [*(dobs.program_requests(rt, dtype) if setup else ()),
            *entry.device.program_requests(rt, C, P, R, cameras, 0, entry, device_setup=setup,
                                           mixed=options.mixed_precision_solves)]


def device_unavailable_reason(evaluator, options, runtime):
    """Why the solve cannot run on the device (None when it can)."""
    if options.device_resident is False:
        return "device_resident=False"
    if options.schur_backend == "numpy":
        return "schur_backend='numpy'"
    if runtime is None:
        return "no OpenCL device"
    model = evaluator.model
    fn = getattr(model, "function", None)
    if evaluator.permute is not None or fn is None or not hasattr(fn, "values_and_jacobians") \
            or getattr(fn, "backend", "numpy") == "numpy" or not hasattr(model, "device_inputs"):
        return "the camera model is not a pyclad BatchFunction on an OpenCL device"
    if fn.dtype not in (np.float32, np.float64):
        return f"the camera model evaluates in {fn.dtype}"
    if fn.dtype == np.float64 and not runtime.info.fp64:
        return f"the device {runtime.info.name!r} has no fp64 (dtype=np.float32 runs on it)"
    solver = linear_solver(options.linear_solver)
    if solver.device is None:
        return f"{options.linear_solver} has no device-resident solver"
    if fn.dtype not in solver.dtypes:
        return (f"{options.linear_solver} on the device needs dtype=np.float64 "
                "(float32 runs iterative_schur)")
    return None


def device_state_or_reason(evaluator, options, runtime, x0):
    """A :class:`DeviceState` when the solve can run on the device, else ``(None, why not)``."""
    why = device_unavailable_reason(evaluator, options, runtime)
    if why is not None:
        return None, why
    return DeviceState(evaluator, options, runtime, x0, profile=options.profile_kernels), None


class DeviceState(LoopState):
    """See the module docstring; same methods and results as ``HostState``."""

    where = "device"

    def __init__(self, evaluator, options, runtime, x0, profile: bool = False, camera_blocks=None,
                 copies=None):
        """``camera_blocks``: the sizes of the parameter blocks that one camera row merges
        (solvers.general.merged_groups), whose diagonal blocks the Schur-Jacobi preconditioner inverts
        apart; None: one block of C. ``copies``: ``(column, count)`` where camera columns are
        copies of columns that several cameras share (merged groups with a shared camera):
        ``column`` (nc * C) the shared problem column of each camera column (-1: a constant
        entry), ``count`` (nc * C, bool) the one copy of each entry that the norms count. The
        gradient and the column norms are summed over the copies, and sparse_schur solves for
        the problem's columns (:class:`solvers.general.key_copies_device.KeyCopies`)."""
        from ..linalg import schur_pcg_device
        from ..linalg.schur_pcg_device import DevicePCG, accumulator_dtype
        ev = evaluator
        # A queue without timestamps unless they are asked for: the iterations make thousands of
        # small launches, each a few microseconds dearer on a profiling queue (Runtime.profiled).
        # Everything of this solve, the model's evaluations included, goes through this one queue.
        rt = runtime.profiled() if profile else runtime.unprofiled()
        self.ev, self.o, self.rt = ev, options, rt
        self.fn = ev.model.function
        C, P = self.fn.group_sizes
        R = self.fn.n_outputs
        self.C, self.P, self.R, self.T = C, P, R, C * (C + 1) // 2
        n, nc, npt = ev.n, ev.nc, ev.npt
        self.n, self.nc, self.npt = n, nc, npt
        # Storage in the model's type; arithmetic and sums in acc (float64 where the device has it).
        self.dtype, self.acc = np.dtype(self.fn.dtype), accumulator_dtype(rt)
        need = device_bytes(n, nc, npt, C, P, R, self.dtype)
        have, limited_by = available_memory(rt.info)
        if need > have:
            raise DeviceMemoryError(
                f"this problem ({n} observations, {nc} cameras, {npt} points) needs about "
                f"{need / 2**30:.2f} GiB ({need} bytes) on {rt.info.name!r} (limited by {limited_by}), "
                f"which has {have / 2**30:.2f} GiB; "
                + ("use dtype=np.float32, " if self.dtype == np.float64 else "") +
                "a device with more memory, or device_resident=False "
                "(the host path) or a CPU device", need, have)
        self.bytes_to_device = self.bytes_to_host = 0
        self.events = [] if profile else None
        self.linear_solver_time = 0.0
        self.copies = None
        if copies is not None:
            if self.dtype != np.float64 or linear_solver(options.linear_solver).iterative:
                raise ValueError("cameras with shared columns (copies) take float64 and sparse_schur")
            from ..general.key_copies_device import KeyCopies
            column, count = copies
            self.copies = KeyCopies(rt, column, int(np.max(column, initial=-1)) + 1, C, R)
        blocks = (C,) if camera_blocks is None else tuple(int(b) for b in camera_blocks)
        if sum(blocks) != C or min(blocks) < 1:
            raise ValueError(f"camera_blocks {camera_blocks} must be positive sizes that add up to C = {C}")
        entry = linear_solver(options.linear_solver)
        # Every program of the solve named at once: those the binary cache lacks are built side by
        # side in worker processes while this one goes on (a cold start's cost is the compiler's).
        own = program_requests(rt, C, P, R, ev.loss.name, self.dtype, blocks, self.copies is not None)
        sent = prefetch([*own, schur_pcg_device.program_request(rt, C, P, R, self.dtype),
                         *entry.device.program_requests(rt, C, P, R, nc, need, entry,
                                                        device_setup=ev.device_observations is not None,
                                                        mixed=options.mixed_precision_solves),
                         *(self.fn.program_request(rt, jacobians) for jacobians in (True, False))], rt)
        # Then those of a larger problem (none on CPUs), queued behind this solve's own: the
        # workers take them only once this solve's are taken. Only where this solve started
        # workers (a cold cache): alone they would start workers in every short process (a warm
        # CLI run), which ends before the workers are up (about a second) and builds nothing.
        if sent:
            prefetch(larger_problem_requests(rt, options, self.dtype, entry, C, P, R), rt)
        # The Evaluator's camera order: sorted once for everything that needs it.
        dev = ev.device_observations
        if dev is not None:     # ordered on the device (solvers.ba.observations_device)
            self.pcg = DevicePCG(rt, None, None, nc, npt, C, P, R, self.dtype, device_observations=dev)
            self.bytes_to_device += dev.bytes_to_device
        else:
            self.pcg = DevicePCG(rt, ev.cam, ev.pt, nc, npt, C, P, R, self.dtype, camera_order=ev.camera_order())
        self.pcg.events = self.events
        # The linear solver of the step (solvers.linalg.linear_solver), after the CG's buffers, which
        # every method shares (the back-substitution, V^-1, Dc^2).
        self.bytes_needed = need
        self.linear = entry.device(self, entry)
        # The reductions' work-group size, and their number of groups (fixed per device, so the
        # sums run in the same order every time).
        self.L = own[0].params["L"]
        self.groups = max(1, (2 if rt.info.is_cpu else 4) * rt.info.compute_units)
        # Kernel objects of this instance alone, each argument set when it changes.
        self.k = {}
        for r in own:
            self.k.update(presets(get_program(TEMPLATE, rt, r.options, **r.params), self))
        # Small groups on CPUs, as DevicePCG's (schur_jacobi has the most live values).
        self.ls = arrays.work_group_size(rt, self.k["schur_jacobi"].kernel, 8 if rt.info.is_cpu else 64)
        real = lambda size: arrays.scratch(rt, max(1, int(size)), self.dtype)  # noqa: E731 (storage)
        sums = lambda size: arrays.scratch(rt, max(1, int(size)), self.acc)  # noqa: E731
        self.ncC, self.total = nc * C, nc * C + npt * P
        self._ncC, self._total = np.int32(self.ncC), np.int32(self.total)     # as kernel arguments
        # What the norms' reductions (the gradient's, the step's, |x|) run over: every entry, or,
        # for a part of a split solve that leaves the cameras to another part
        # (solvers.split.partitioned_device), the points alone (ncC = 0: every index a point entry).
        self._norm_ncC, self._norm_total = self._ncC, self.total
        x0 = np.asarray(x0, dtype=self.dtype)
        self._views = {}
        self.x = self._upload_pair(x0)
        self.cand = (real(self.ncC), real(npt * P))
        self.best_x = (real(self.ncC), real(npt * P))
        self.delta = (real(self.ncC), real(npt * P))
        self.s = (real(self.ncC), real(npt * P))
        self.diag = (real(self.ncC), real(npt * P))
        # The gradient; its point part is DevicePCG's gp, which its back-substitution reads.
        self.g = (real(self.ncC), self.pcg.gp)
        self.B, self.V = real(nc * self.T), real(npt * P * P)
        self.partial = sums(self.pcg.nseg * (self.T + C))
        # With copies: the camera part's column norms summed over them (cd), and the entries the
        # norms count; kernel arguments put before the others (lm_device.cl.mako's COPIES).
        self._cd, self._count = [], []
        if self.copies is not None:
            self.cd = real(self.ncC)
            # The camera gradient summed over the copies, for the norms (the linear solve sums
            # the keys' right-hand side itself, so g keeps the keys' own).
            self.g_sum = (real(self.ncC), self.g[1])
            self.count_c = self._upload(np.asarray(copies[1], np.uint8).ravel()) if self.ncC else real(1)
            self._cd, self._count = [self.cd.data], [self.count_c.data]
        self.value = sums(n)
        self.reduce_partial = sums(2 * self.groups)
        self.scalars = sums(N_SCALARS)
        self.failed = arrays.scratch(rt, max(1, nc), np.int32)
        self.index, self.observed = ev.model.device_inputs()
        if rt is not runtime:
            runtime.queue.finish()          # the model's uploads, on its own queue, are done
        if dev is None:         # (else made on the device, from the uploads counted above)
            self.bytes_to_device += self.index.nbytes + (self.observed.nbytes if self.observed is not None else 0)
        self.loss_a, self.loss_b = self.acc.type(ev.loss.scale), self.acc.type(ev.loss.b)
        self.r = self.jc = self.jp = None
        # Camera entries held constant (hold_constant), and what |x| leaves out.
        self.free, self.norm_excluded = None, 0.0
        # What crossed before the first iteration (parameters, index, observations) and after the
        # last (the best parameters) apart from what the iterations move.
        self.bytes_at_start, self.bytes_at_end = self.bytes_to_device, 0
        self.bytes_to_device = 0
        # |x| in scalars[NORM]: None until a reduction of it is enqueued, then whether a read of
        # the scalars since has brought it (the queue is in order).
        self._norm_read = None
        self.remember_best()

    def hold_constant(self, free_c, free_p, excluded_sq: float = 0.0):
        """Hold the entries where ``free_c`` (cameras, C) and ``free_p`` (points, P) are False
        constant: their Jacobian columns are zeroed at every evaluation, so they take no step.
        ``excluded_sq``: the squared norm of entries that the caller's state leaves out of ``|x|``
        (the constant parameter blocks, which Ceres drops), subtracted from it
        (solvers.general.merged_groups)."""
        masks = []
        for name, free, rows, size in (("free_c", free_c, self.nc, self.C), ("free_p", free_p, self.npt, self.P)):
            free = np.asarray(free, bool)
            if free.shape != (rows, size):
                raise ValueError(f"hold_constant: {name} must be ({rows}, {size}), got {free.shape}")
            masks.append(free.astype(np.uint8).ravel())
        before = self.bytes_to_device
        self.free = [self._upload(m) if m.size else arrays.scratch(self.rt, 1, np.uint8) for m in masks]
        self.bytes_at_start += self.bytes_to_device - before        # before the iterations
        self.bytes_to_device = before
        self.norm_excluded = float(excluded_sq)

    # -- small helpers -----------------------------------------------------------------------
    def _upload(self, a):
        self.bytes_to_device += a.nbytes
        return arrays.to_device(self.rt, np.ascontiguousarray(a))

    def _upload_pair(self, x):
        return (self._upload(x[:self.ncC]) if self.ncC else arrays.scratch(self.rt, 1, self.dtype),
                self._upload(x[self.ncC:]) if self.total > self.ncC else arrays.scratch(self.rt, 1, self.dtype))

    def launch(self, name, items, *args):
        """Enqueue kernel ``name`` over ``items`` work-items (nothing when there are none)."""
        if items <= 0:
            return
        ev = self.k[name](self.rt.queue, (arrays.round_up(items, self.ls),), (self.ls,), *args)
        if self.events is not None:
            self.events.append((name, ev))

    def _reduce(self, name, slot, total, *args, second_max=False):
        """A two-stage reduction into ``scalars[slot]``, ``scalars[slot + 1]``."""
        q, L, G = self.rt.queue, self.L, self.groups
        e1 = self.k[name](q, (G * L,), (L,), *args, np.int32(total), self.reduce_partial.data)
        e2 = self.k["finish"](q, (L,), (L,), self.reduce_partial.data, np.int32(G),
                              np.int32(1 if second_max else 0), self.scalars.data, np.int32(slot))
        if self.events is not None:
            self.events += [(name, e1), ("finish", e2)]

    def read_scalars(self):
        host = np.empty(N_SCALARS, self.acc)
        cl.enqueue_copy(self.rt.queue, host, self.scalars.data)
        self.bytes_to_host += host.nbytes
        host = host.astype(np.float64)
        self._scalars = host
        if self._norm_read is False:
            self._norm_read = True
        return host

    def _pairs(self, *vectors):
        return [b.data for v in vectors for b in v]

    def _reduce_cost(self, r, with_jacobians, read=True):
        """Per-observation rho (corrected r, Jc, Jp in place when ``with_jacobians``), summed;
        the cost (None when not finite), or nothing yet with ``read=False`` (see _cost)."""
        n = self.n
        if with_jacobians:
            self.launch("correct_jacobian", n, r.data, self.jc.data, self.jp.data, self.value.data,
                      np.int32(n), self.loss_a, self.loss_b)
        else:
            self.launch("residual_cost", n, r.data, self.value.data, np.int32(n), self.loss_a, self.loss_b)
        slot = COST if with_jacobians else CANDIDATE
        self._reduce("reduce_sum", slot, n, self.value.data)
        return self._cost(self.read_scalars(), slot) if read else None

    @staticmethod
    def _cost(scalars, slot):
        cost = 0.5 * scalars[slot]
        return float(cost) if np.isfinite(cost) else None

    def _model_params(self, x):
        """The model's parameter tables over the pair ``x`` (self.x or self.cand, which trade
        places): views made once per pair, since a pyopencl view costs tens of microseconds."""
        key = (id(x[0]), id(x[1]))
        views = self._views.get(key)
        if views is None:
            views = self._views[key] = [x[0][:self.ncC].reshape(self.nc, self.C),
                                        x[1][:self.npt * self.P].reshape(self.npt, self.P)]
        return views

    # -- evaluation at x ---------------------------------------------------------------------
    def evaluate_jacobian(self, first: bool):
        self.enqueue_jacobian()
        sc = self.finish_jacobian(first)
        return self._jacobian_result(sc)

    def enqueue_jacobian(self):
        """Enqueue the model's residuals and Jacobian at x, the robust correction, the cost's
        reduction, and the normal equations' blocks B, V and gradient g (nothing read yet; a
        split solve sums B and the camera gradient over its parts before :meth:`finish_jacobian`)."""
        ev, n = self.ev, self.n
        t0 = time.perf_counter()
        # Let the last Jacobian go first: the new one takes its memory.
        self.r = self.jc = self.jp = None
        self.pcg.unbind_jacobian()
        try:
            r, (jc, jp) = self.fn.values_and_jacobians(self._model_params(self.x), self.index,
                                                       data=self.observed, device=self.rt,
                                                       index_checked=True)
            self.r, self.jc, self.jp = r, jc, jp
            arrays.keep_on_simulator(self.rt, r, jc, jp)
            if self.events is not None:
                self.events += [("model_jacobian", e) for e in r.events]
            # The cost is read with the gradient below: one wait for the device, not two.
            # (A Jacobian whose cost is not finite gets normal equations too, which go unused.)
            if n:
                self._reduce_cost(r, with_jacobians=True, read=False)
                if self.free is not None:
                    self.launch("hold_constants", n, jc.data, jp.data, self.pcg.cam.data, self.pcg.pt.data,
                              *(f.data for f in self.free), np.int32(n))
        finally:
            ev.num_jacobian_evaluations += 1
            ev.jacobian_time += time.perf_counter() - t0
        t0 = time.perf_counter()
        npt, nc, g, pcg = self.npt, self.nc, self.g, self.pcg
        self.launch("point_normal", npt, jp.data, r.data, pcg.pt_start.data, self.V.data, g[1].data, np.int32(npt))
        self.launch("camera_partials", pcg.nseg, jc.data, r.data, pcg.obs.data, pcg.seg_start.data,
                  self.partial.data, np.int32(pcg.nseg))
        self.launch("camera_normal", nc * (self.T + self.C), self.partial.data, pcg.cam_seg.data, self.B.data, g[0].data, np.int32(nc))
        self.linear_solver_time += time.perf_counter() - t0

    def finish_jacobian(self, first: bool):
        """After :meth:`enqueue_jacobian`: the Jacobi scaling (first), the gradient's norms; the
        scalars read back (the cost's and the gradient's slots)."""
        t0 = time.perf_counter()
        g = self.g
        if self.copies is not None:
            # A shared column's gradient and norm: the sums over its copies, at every copy.
            self.launch("camera_diagonal", self.ncC, self.B.data, self.cd.data, self._ncC)
            self.copies.sum_in_place(self.cd)
            if self.ncC:
                cl.enqueue_copy(self.rt.queue, self.g_sum[0].data, g[0].data, byte_count=g[0].nbytes)
            self.copies.sum_in_place(self.g_sum[0])
            g = self.g_sum
        if first:
            self.launch("jacobi_scale", self.total, *self._cd, self.B.data, self.V.data, *self._pairs(self.s),
                      self._ncC, self._total, np.int32(1 if self.o.jacobi_scaling else 0))
        self._reduce("reduce_gradient", GRADIENT, self._norm_total, *self._count, *self._pairs(self.x, g),
                     self._norm_ncC, second_max=True)
        sc = self.read_scalars()
        self.linear_solver_time += time.perf_counter() - t0
        return sc

    def _jacobian_result(self, sc):
        """``evaluate_jacobian``'s result from the scalars (None: the cost is not finite)."""
        cost = self._cost(sc, COST) if self.n else 0.0
        if cost is None:
            return None
        self.bind_jacobian()
        return cost, float(sc[GRADIENT + 1]), float(np.sqrt(sc[GRADIENT]))

    def bind_jacobian(self):
        """Hand the new Jacobian and residuals to the CG's products (a finite cost's)."""
        self.pcg.bind_jacobian(self.jc, r_dev=self.r, Jp_dev=self.jp)

    # -- the step ----------------------------------------------------------------------------
    def solve_step(self, radius: float, reuse_diagonal: bool) -> StepSolution:
        pcg = self.pcg
        t0 = time.perf_counter()
        try:
            self.regularize(radius, reuse_diagonal)
            ok, its, msg = self.linear.solve()
            if ok is False:
                return StepSolution(False, its, msg)
            # ok None: the solver's verdict comes with the step's scalars (one wait, not two).
            outcome = self.linear.outcome if ok is None else None
            return self._step_from((pcg.x, pcg.back_substitute_solution()), its, msg, outcome)
        finally:
            self.linear_solver_time += time.perf_counter() - t0

    def regularize(self, radius, reuse_diagonal):
        """Enqueue the LM diagonal (unless reused), Dc^2 and V^-1 = (V + Dp^2)^-1 for ``radius``."""
        o, pcg, npt, ncC, total = self.o, self.pcg, self.npt, self._ncC, self._total
        if not reuse_diagonal:
            self.launch("lm_diagonal", self.total, *self._cd, self.B.data, self.V.data, *self._pairs(self.s, self.diag),
                      ncC, total, self.acc.type(o.min_lm_diagonal), self.acc.type(o.max_lm_diagonal))
        radius = self.acc.type(radius)
        self.launch("camera_regularize", self.ncC, *self._count, self.diag[0].data, self.s[0].data, pcg.dc2.data, radius, ncC)
        self.launch("point_regularize", npt, self.V.data, self.diag[1].data, self.s[1].data, pcg.Vinv.data,
                  radius, np.int32(npt))
        pcg.device_inputs_written()

    def _step_from(self, raw, its, msg, outcome=None) -> StepSolution:
        """The step, candidate and model cost change from the linear solution ``raw`` (camera and
        point parts on the device). ``outcome``: the linear solver's ``(ok, message)``, known once
        the queue has passed the solve (a failed solve's step, made all the same, is dropped)."""
        self.enqueue_step(raw)
        return self.step_verdict(self.read_scalars(), its, msg, outcome)

    def enqueue_step(self, raw):
        """Enqueue the step, the candidate, the model cost change and the step's norms."""
        pcg, ncC, total = self.pcg, self._ncC, self._total
        self.launch("make_step", self.total, *self._pairs(raw, self.s, self.x, self.delta, self.cand), ncC, total)
        self.launch("model_change", self.n, self.jc.data, self.jp.data, self.r.data, pcg.cam.data, pcg.pt.data,
                  self.delta[0].data, self.delta[1].data, self.value.data, np.int32(self.n))
        self._reduce("reduce_sum", CHANGE, self.n, self.value.data)
        self._reduce("reduce_step", STEP, self._norm_total, *self._count,
                     *self._pairs(self.x, self.cand, raw), self._norm_ncC)

    def step_verdict(self, sc, its, msg, outcome=None) -> StepSolution:
        if outcome is not None:
            ok, msg = outcome()
            if not ok:
                return StepSolution(False, its, msg)
        if sc[STEP + 1] > 0:
            return StepSolution(False, its, "Linear solver failure. Failed to compute a finite step.")
        self.step_norm = float(np.sqrt(sc[STEP]))
        return StepSolution(True, its, msg, float(-sc[CHANGE]))

    @property
    def linear_solver_detail(self) -> str:
        """How the linear systems are solved, for the log (sparse_schur: where S is factorised)."""
        return self.linear.description

    def evaluate_candidate(self):
        return self._candidate(), self.step_norm

    def _candidate(self, read=True):
        """The candidate's residuals and cost: the cost (None when not finite), or with
        ``read=False`` only enqueued (into the scalars' CANDIDATE, zero without observations)."""
        ev = self.ev
        t0 = time.perf_counter()
        try:
            r = self.fn.values(self._model_params(self.cand), self.index, data=self.observed,
                               device=self.rt, index_checked=True)
            arrays.keep_on_simulator(self.rt, r)
            if self.events is not None:
                self.events += [("model_residuals", e) for e in r.events]
            if not read:
                return self._reduce_cost(r, with_jacobians=False, read=False)
            return self._reduce_cost(r, with_jacobians=False) if self.n else 0.0
        finally:
            ev.num_residual_evaluations += 1
            ev.residual_time += time.perf_counter() - t0

    def accept(self):
        self.x, self.cand = self.cand, self.x
        # |x| comes back with the next read of the scalars (the evaluation at the new x follows).
        self._enqueue_norm()

    def _enqueue_norm(self):
        self._reduce("reduce_norm", NORM, self._norm_total, *self._count, *self._pairs(self.x), self._norm_ncC)
        self._norm_read = False

    def norm_sq(self) -> float:
        """``|x|^2`` over the entries this state's norms count."""
        if self._norm_read is None:
            self._enqueue_norm()
        if not self._norm_read:
            self.read_scalars()
        return float(self._scalars[NORM] - self.norm_excluded)

    @property
    def x_norm(self) -> float:
        return float(np.sqrt(max(self.norm_sq(), 0.0)))

    def remember_best(self):
        q = self.rt.queue
        for dst, src in zip(self.best_x, self.x):
            if src.size:
                cl.enqueue_copy(q, dst.data, src.data, byte_count=src.nbytes)

    def best(self, final: bool = True) -> np.ndarray:
        """The best parameters seen, read back (a new float64 host array). A read before the end
        (``final=False``: a checkpoint) counts among the iterations' transfers; it waits for the
        queue, and changes nothing on the device."""
        out = np.empty(self.total, self.dtype)
        parts = [(self.best_x[0], out[:self.ncC]), (self.best_x[1], out[self.ncC:])]
        for dev, host in parts:
            if host.size:
                cl.enqueue_copy(self.rt.queue, host, dev.data)
        self.rt.queue.finish()
        if final:
            self.bytes_at_end += out.nbytes
        else:
            self.bytes_to_host += out.nbytes
        return out.astype(np.float64, copy=False)     # float32 storage: widened; float64: as read

    def close(self):
        """The solve is over (the Minimizer calls this last): kernel objects go back to their
        pools for the next solve, and the Jacobian's memory to the queue's pool."""
        release_kernels(self, self.pcg, *([self.copies] if self.copies is not None else []))
        self.linear.close()
        self.r = self.jc = self.jp = None
        self.pcg.unbind_jacobian()

    def transfers(self) -> dict:
        """Bytes that crossed between host and device: during the iterations (``bytes_to_device``,
        ``bytes_to_host``), and before and after them (``bytes_at_start``, ``bytes_at_end``)."""
        parts = (self, self.pcg, self.linear)
        return {"bytes_to_device": int(sum(a.bytes_to_device for a in parts)),
                "bytes_to_host": int(sum(a.bytes_to_host for a in parts)),
                "bytes_at_start": int(self.bytes_at_start), "bytes_at_end": int(self.bytes_at_end)}

    def kernel_time(self) -> dict:
        """Seconds the device spent in each kernel enqueued so far, and their ``total`` (with
        ``profile=True``)."""
        if self.events is None:
            raise ValueError("kernel_time() needs DeviceState(..., profile=True)")
        self.rt.queue.finish()
        out = {}
        for name, e in self.events:
            out[name] = out.get(name, 0.0) + (e.profile.end - e.profile.start) * 1e-9
        out["total"] = sum(out.values())
        return out
