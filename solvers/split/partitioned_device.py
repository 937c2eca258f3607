"""A bundle adjustment split over devices or MPI ranks with every part's state on its device.

:mod:`solvers.split.partitioned` splits the points into contiguous ranges, one per part, and sums the
camera-sized quantities over the parts. Its state keeps the Jacobians on the host (the reference
path); this one keeps each part's as :class:`solvers.ba.lm_device.DeviceState` does: a
:class:`DevicePart` is the device-resident state of the part's sub-problem (every camera, the
part's points and all their observations). What crosses between the parts, as host arrays
summed by the parts' reducer (:class:`solvers.split.parts.LocalParts` or ``MPIParts``):

- per Jacobian evaluation: the camera blocks ``B`` of ``J^T J`` (C (C + 1) / 2 per camera) and the
  camera gradient, read from every part, summed and written back, so that the Jacobi scaling, the
  LM diagonal and ``Dc^2`` are computed from the whole problem's sums on every part alike; the
  cost and the gradient's norms (scalars);
- per linear solve (``iterative_schur``): every part's per-camera sums of ``G V^-1 G^T``, so that
  every part inverts the same Schur-Jacobi blocks on its device;
- per CG step: one camera-sized vector, each part's share of the implicit product ``S p`` (of
  the right-hand side at the start, of ``S x`` at a residual reset). Every part runs the device
  CG's kernels on the same camera vectors, reading the total (:func:`solvers.linalg.schur_pcg_device.run_split`);
  the parts' CG states come with the shares and must agree;
- per step and candidate: the model cost change, the step's norms and the candidate's cost.

The parts' norms count the cameras once: the first part's reductions run over every entry, the
others' over their points alone. The iterations and costs equal the one-device solve's up to the
order of the sums (the tests hold the final cost to 1e-9 relative).

Only ``iterative_schur``: a split ``sparse_schur`` would send every part's blocks of the reduced
camera matrix per solve, which the host reference path (:class:`solvers.split.partitioned.PartitionedState`)
does.
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import pyopencl as cl

from .parts import describe_split
from ..loop.step import LoopState, StepSolution
from ..ba.lm_device import CANDIDATE, COST, GRADIENT, DeviceState


class DevicePart(DeviceState):
    """One part: the device-resident state of its sub-problem (``evaluator``: every camera, the
    points ``lo:hi``), ``x0`` its cameras and points. ``counts_cameras``: whether its norms count
    the camera entries (one part's do). ``camera_blocks``: as DeviceState's (a merge's)."""

    def __init__(self, evaluator, options, runtime, x0, lo: int, hi: int, counts_cameras: bool,
                 camera_blocks=None):
        super().__init__(evaluator, options, runtime, x0, profile=options.profile_kernels,
                         camera_blocks=camera_blocks)
        self.runtime, self.lo, self.hi = runtime, lo, hi
        if not counts_cameras:
            self._norm_ncC, self._norm_total = np.int32(0), self.npt * self.P

    def camera_normal_share(self) -> np.ndarray:
        """This part's camera blocks ``B`` (nc * T) and camera gradient (nc * C), one float64 array."""
        q, nT = self.rt.queue, self.nc * self.T
        out = np.empty(nT + self.ncC, self.dtype)
        if self.nc:
            cl.enqueue_copy(q, out[:nT], self.B.data, is_blocking=False)
            cl.enqueue_copy(q, out[nT:], self.g[0].data)
            self.bytes_to_host += out.nbytes
        return out.astype(np.float64, copy=False)

    def set_camera_normal(self, total: np.ndarray):
        """Write the sums over every part (:meth:`camera_normal_share`'s layout) in place of its own."""
        nT = self.nc * self.T
        if self.nc:
            host = total.astype(self.dtype)
            cl.enqueue_copy(self.rt.queue, self.B.data, host[:nT], is_blocking=False)
            cl.enqueue_copy(self.rt.queue, self.g[0].data, host[nT:])      # (blocking: host lives here)
            self.bytes_to_device += host.nbytes

    def candidate_scalars(self) -> np.ndarray:
        """The candidate's cost (in ``CANDIDATE``) among the scalars."""
        self._candidate(read=False)
        return self.read_scalars()

    def split_preconditioner(self, jacobi: np.ndarray):
        """The Schur-Jacobi preconditioner from the summed camera blocks B (on the device) and the
        parts' summed ``G V^-1 G^T`` blocks ``jacobi`` (nc * T), as the one-device solve makes it."""
        self.linear.preconditioner(*self.pcg.split_jacobi_total(jacobi))


class PartitionedDeviceState(LoopState):
    """:class:`solvers.loop.lm.Minimizer`'s state over :class:`DevicePart` s (the module docstring);
    ``comm`` sums over the parts of every process; ``evaluator`` (the whole problem's) counts the
    evaluations."""

    where = "partitioned-device"

    def __init__(self, evaluator, options, parts: Sequence[DevicePart], comm):
        self.ev, self.o, self.parts, self.comm = evaluator, options, list(parts), comm
        first = self.parts[0]
        self.nc, self.C, self.T = first.nc, first.C, first.T
        self.linear_solver_time = 0.0
        self.step_norm = 0.0

    # -- helpers ---------------------------------------------------------------------------
    def _map(self, fn):
        return self.comm.map(fn, self.parts)

    def _sum(self, local_values):
        """The sum over every part of the arrays ``local_values`` (this process's parts')."""
        return self.comm.sum(np.sum(local_values, axis=0))

    def _scalars(self, per_part, max_slot=None):
        """The parts' scalar arrays summed (``max_slot``: that slot their maximum)."""
        total = self._sum(per_part)
        if max_slot is not None:
            total[max_slot] = self.comm.max(np.array([max(s[max_slot] for s in per_part)]))[0]
        return total

    # -- evaluation at x ---------------------------------------------------------------------
    def evaluate_jacobian(self, first: bool):
        t0 = time.perf_counter()
        self._map(lambda p: p.enqueue_jacobian())
        self.ev.num_jacobian_evaluations += 1
        t1 = time.perf_counter()
        self.ev.jacobian_time += t1 - t0
        total = self._sum(self._map(lambda p: p.camera_normal_share()))
        self._map(lambda p: p.set_camera_normal(total))
        sc = self._scalars(self._map(lambda p: p.finish_jacobian(first)), max_slot=GRADIENT + 1)
        self.linear_solver_time += time.perf_counter() - t1
        cost = 0.5 * sc[COST]
        if not np.isfinite(cost):
            return None
        for p in self.parts:
            p.bind_jacobian()
        return float(cost), float(sc[GRADIENT + 1]), float(np.sqrt(sc[GRADIENT]))

    # -- the step ----------------------------------------------------------------------------
    def solve_step(self, radius: float, reuse_diagonal: bool) -> StepSolution:
        o = self.o
        t0 = time.perf_counter()
        try:
            self._map(lambda p: p.regularize(radius, reuse_diagonal))
            jacobi = self._sum(self._map(lambda p: p.pcg.part_jacobi_sums()))
            self._map(lambda p: p.split_preconditioner(jacobi))
            ok, its, msg = self._conjugate_gradients(o.eta, -1.0, o.max_linear_solver_iterations)
            if not ok:
                return StepSolution(False, its, msg)

            def step(p):
                p.enqueue_step((p.pcg.x, p.pcg.back_substitute_solution()))
                return p.read_scalars()
            sc = self._scalars(self._map(step))
            # Every part reads the same sums, so every verdict (and step norm) is the same.
            verdicts = [p.step_verdict(sc, its, msg) for p in self.parts]
            if verdicts[0].ok:
                self.step_norm = self.parts[0].step_norm
            return verdicts[0]
        finally:
            self.linear_solver_time += time.perf_counter() - t0

    def _conjugate_gradients(self, q_tolerance, r_tolerance, max_iterations):
        """The device CG of every part, the products summed over the parts (and every process)."""
        from ..linalg.schur_pcg_device import run_split
        return run_split([p.pcg for p in self.parts], self.comm.map, self.comm.sum,
                         q_tolerance, r_tolerance, max_iterations)

    def evaluate_candidate(self):
        t0 = time.perf_counter()
        sc = self._scalars(self._map(lambda p: p.candidate_scalars()))
        self.ev.num_residual_evaluations += 1
        self.ev.residual_time += time.perf_counter() - t0
        cost = 0.5 * sc[CANDIDATE]
        return (float(cost) if np.isfinite(cost) else None), self.step_norm

    def accept(self):
        for p in self.parts:
            p.accept()

    @property
    def x_norm(self) -> float:
        sq = self._sum([np.array([p.norm_sq()]) for p in self.parts])[0]
        return float(np.sqrt(max(sq, 0.0)))

    def remember_best(self):
        for p in self.parts:
            p.remember_best()

    def best(self, final: bool = True) -> np.ndarray:
        """The best parameters: the cameras, then every part's points in order, on every process."""
        xs = [p.best(final) for p in self.parts]
        ncC = self.nc * self.C
        local = np.concatenate([x[ncC:] for x in xs])
        return np.concatenate([xs[0][:ncC], self.comm.concat(local)])

    def transfers(self) -> dict:
        """The parts' host-device bytes added up (this process's), and ``reduced_bytes``: what
        this process contributed to the reductions, all iterations."""
        out = {}
        for p in self.parts:
            for k, v in p.transfers().items():
                out[k] = out.get(k, 0) + v
        out["reduced_bytes"] = self.comm.bytes
        return out

    def kernel_time(self) -> dict:
        out = {}
        for p in self.parts:
            for k, v in p.kernel_time().items():
                out[k] = out.get(k, 0.0) + v
        return out

    @property
    def linear_solver_detail(self) -> str:
        return describe_split(self.comm, self.parts, "Schur products summed over the parts per CG step; "
                              "Jacobians, normal equations and vectors on the devices")

    def close(self):
        try:
            for p in self.parts:
                p.close()
        finally:
            self.comm.close()

