"""Bundle adjustment split across several OpenCL devices of one host, or across MPI ranks.

The points are cut into contiguous ranges with about as many observations each, one range per
part (a device, or a rank); a part holds its points and all their observations, so the point
elimination of the Schur complement stays local. Only camera-sized quantities cross parts:

- per Jacobian evaluation: the cost, the camera blocks of ``J^T J`` (their diagonals for the
  Jacobi scaling and the LM diagonal) and the camera gradient;
- per linear solve (``sparse_schur``): each part's share of the reduced camera matrix (its
  pairs' blocks, on the union of all parts' block patterns) and of the reduced right-hand side;
  every part then factorises the same summed matrix, so no solution needs sending;
- per CG step (``iterative_schur``): the product of the implicit Schur complement with the
  camera vector (one camera-sized vector);
- per candidate: its cost and the step's norms.

This module holds the host reference path of a split (:class:`PartitionedState`): ``sparse_schur``,
or ``device_resident=False``. With ``iterative_schur`` the parts keep their states on their
devices instead (:mod:`solvers.split.partitioned_device`); :func:`partitioned_state` chooses.

The arithmetic per part is the single-device reference's (:class:`solvers.ba.host_state.HostState`
with :class:`solvers.ba.schur.NormalEquations`, the per-observation and per-pair products on the
part's device when it has fp64): the iterations and costs equal the one-device solve's up to the
order in which the parts' sums are added (the tests hold the final cost to 1e-9 relative).

Two ways to reduce, one state (both in :mod:`solvers.split.parts`, with the ranges and the parts'
evaluators): :class:`LocalParts` (the parts of this process, summed in part order; a thread
per part runs the parts' work at once) and :class:`MPIParts` (one part per rank,
``Allreduce``; every rank runs the same minimizer on the same reduced numbers, so every rank
takes the same decisions; rank 0 prints and writes).
"""
from __future__ import annotations

import time
from typing import Optional, Sequence

import numpy as np

from ..linalg.cg import conjugate_gradients
from ..linalg.linear_solver import linear_solver
from ..loop.step import LoopState, StepSolution
from .parts import LocalParts, MPIParts, describe_split, part_evaluators, point_ranges, rank_runtime
from ..ba.schur import (NormalEquations, Pairs, Structure, j_x, row_squares, solve_reduced,
                        spd_block_inverses)


class Part:
    """One part: its evaluator (cameras, its points, their observations), device and state."""

    def __init__(self, evaluator, runtime, lo: int, hi: int):
        self.ev, self.runtime, self.lo, self.hi = evaluator, runtime, lo, hi
        self.st = Structure(evaluator.cam, evaluator.pt, evaluator.nc, evaluator.npt,
                            evaluator.C, evaluator.P, evaluator.R)
        self.cl_structure = None
        if runtime is not None and runtime.info.fp64:
            from ..ba.schur_device import ClStructure
            self.cl_structure = ClStructure(self.st, runtime)
        # The state's per-part vectors (solvers.split.partitioned.PartitionedState sets them): the
        # points, their Jacobi scaling and LM diagonal, V's inverses, the step, the candidate.
        self.neq: Optional[NormalEquations] = None
        self.pts = self.scale = self.diagonal = self.Vinv = self.delta = self.cand = None
        self.block_positions = None   # where its pair blocks sit in the union of every part's

    def normal_equations(self, r, jc, jp):
        if self.cl_structure is not None:
            from ..ba.schur_device import NormalEquationsCL
            return NormalEquationsCL(self.st, r, jc, jp, self.cl_structure)
        return NormalEquations(self.st, r, jc, jp)


class PartitionedState(LoopState):
    """:class:`solvers.loop.lm.Minimizer`'s state (the methods of :class:`solvers.ba.host_state.HostState`)
    over parts that hold disjoint ranges of the points. ``x`` is kept as the cameras (every part)
    and each part's points; ``evaluator`` (the whole problem's) only counts the evaluations."""

    where = "partitioned"

    def __init__(self, evaluator, options, x0, parts: Sequence[Part], comm):
        self.ev, self.o, self.parts, self.comm = evaluator, options, list(parts), comm
        # Parameters per camera and per point: the evaluator's (BAL's 9 and 3, or any others).
        self.C, self.P = C, P = evaluator.C, evaluator.P
        self.ncC = ncC = C * evaluator.nc
        x0 = np.asarray(x0, dtype=np.float64)
        self.cams = x0[:ncC].copy()
        for p in self.parts:
            p.pts = x0[ncC + P * p.lo:ncC + P * p.hi].copy()
        self.best_cams = self.cams.copy()
        self.best_pts = [p.pts.copy() for p in self.parts]
        self.linear_solver_time = 0.0
        self.diagonal = None
        self._global_pairs = None

    # -- helpers ---------------------------------------------------------------------------
    def _x(self, p, cams=None, pts=None):
        return np.concatenate([self.cams if cams is None else cams, p.pts if pts is None else pts])

    def _sum(self, local):
        """The sum over every part of this process's ``local`` (its parts' values combined)."""
        return self.comm.sum(local)

    def _scalars(self, *local):
        """Several scalar sums in one reduction."""
        return [float(v) for v in self._sum(np.array(local, dtype=np.float64))]

    def _all_ok(self, flags) -> bool:
        return self._scalars(0.0 if all(flags) else 1.0)[0] == 0

    # -- evaluation at x ---------------------------------------------------------------------
    def evaluate_jacobian(self, first: bool):
        t0 = time.perf_counter()
        results = self.comm.map(lambda p: p.ev.evaluate(self._x(p)), self.parts)
        self.ev.num_jacobian_evaluations += 1
        self.ev.jacobian_time += time.perf_counter() - t0
        if not self._all_ok([r is not None for r in results]):
            return None
        t1 = time.perf_counter()
        for p, (_, r, jc, jp) in zip(self.parts, results):
            p.neq = p.normal_equations(r, jc, jp)
        cost, = self._scalars(sum(res[0] for res in results))
        if first:
            if self.o.jacobi_scaling:
                col2_c = self._sum(sum(p.st.camera_sum(row_squares(res[2])).ravel()
                                       for p, res in zip(self.parts, results)))
                self.scale_c = 1.0 / (1.0 + np.sqrt(col2_c))
                for p, res in zip(self.parts, results):
                    p.scale = 1.0 / (1.0 + np.sqrt(p.st.point_sum(row_squares(res[3])).ravel()))
            else:
                self.scale_c = np.ones(self.ncC)
                for p in self.parts:
                    p.scale = np.ones(p.pts.size)
        self.gc = self._sum(sum(p.neq.gc for p in self.parts)).ravel()
        # The gradient's norms as Ceres measures them, |x - Plus(x, -g)|, over cameras and points.
        proj_c = self.cams - (self.cams + (-self.gc))
        proj_p = [p.pts - (p.pts + (-p.neq.gp.ravel())) for p in self.parts]
        local = np.array([max([0.0] + [float(np.max(np.abs(q))) for q in proj_p if q.size])])
        gmax = max(float(np.max(np.abs(proj_c))) if proj_c.size else 0.0, float(self.comm.max(local)[0]))
        sq = self._scalars(sum(float(np.dot(q, q)) for q in proj_p))[0] + float(np.dot(proj_c, proj_c))
        self.linear_solver_time += time.perf_counter() - t1
        return cost, gmax, sq ** 0.5

    # -- the step ----------------------------------------------------------------------------
    def solve_step(self, radius: float, reuse_diagonal: bool) -> StepSolution:
        o = self.o
        t0 = time.perf_counter()
        if not reuse_diagonal:
            bdiag = self._sum(sum(np.einsum("cii->ci", p.neq.B).ravel() for p in self.parts))
            self.diagonal = np.clip(bdiag * self.scale_c * self.scale_c, o.min_lm_diagonal, o.max_lm_diagonal)
            for p in self.parts:
                vdiag = np.einsum("pii->pi", p.neq.V).ravel()
                p.diagonal = np.clip(vdiag * p.scale * p.scale, o.min_lm_diagonal, o.max_lm_diagonal)
        Dc2 = (np.sqrt(self.diagonal / radius) / self.scale_c) ** 2
        for p in self.parts:
            Dp2 = (np.sqrt(p.diagonal / radius) / p.scale) ** 2
            p.Vinv = p.neq.v_inverse(Dp2.reshape(-1, self.P))
        nc = self.ev.nc
        Dc2 = Dc2.reshape(nc, self.C)
        if not linear_solver(o.linear_solver).iterative:
            yc, ok, its, msg = self._solve_explicit(Dc2)
        else:
            yc, ok, its, msg = self._solve_pcg(Dc2)
        if ok:
            yps = self.comm.map(lambda p: p.neq.back_substitute(p.Vinv, yc).ravel(), self.parts)
            finite = np.all(np.isfinite(yc)) and all(np.all(np.isfinite(y)) for y in yps)
            if not self._all_ok([finite]):
                ok, msg = False, "Linear solver failure. Failed to compute a finite step."
        self.linear_solver_time += time.perf_counter() - t0
        if not ok:
            return StepSolution(False, its, msg)
        # As HostState: step = -(y / scale) in the scaled variables; delta = step * scale.
        self.delta_c = (-(yc.ravel() / self.scale_c)) * self.scale_c
        mcc_local = 0.0
        for p, yp in zip(self.parts, yps):
            p.delta = (-(yp / p.scale)) * p.scale
            m = j_x(p.neq.Jc, self.delta_c.reshape(-1, self.C)[p.st.cam]) + \
                j_x(p.neq.Jp, p.delta.reshape(-1, self.P)[p.st.pt])
            mcc_local += float(-np.sum(m * (p.neq.r + m / 2.0)))
        mcc, = self._scalars(mcc_local)
        return StepSolution(True, its, msg, mcc)

    def _pairs(self):
        """The union of the parts' block patterns (the same on every part) and, per part, where
        its blocks sit in it."""
        if self._global_pairs is None:
            nc = self.ev.nc
            keys = [p.st.pairs().block_row.astype(np.int64) * nc + p.st.pairs().block_col for p in self.parts]
            union = self.comm.union(np.concatenate(keys))
            for p, k in zip(self.parts, keys):
                p.block_positions = np.searchsorted(union, k)
            self._global_pairs = Pairs(None, None, union // nc, union % nc, [])
        return self._global_pairs

    def _solve_explicit(self, Dc2):
        pairs = self._pairs()
        nb = pairs.block_row.size
        nc, C = self.ev.nc, self.C
        CC = C * C

        def share(p):
            # The part's reduced system with no damping (Dc^2 is added once, to the sum below).
            part_blocks, B, rhs = p.neq.reduced_camera_system(p.Vinv, np.zeros(p.neq.B.shape[:2]))
            blocks = np.zeros((nb, C, C))
            blocks[p.block_positions] = part_blocks   # a part's blocks are distinct
            return blocks, B, rhs
        shares = self.comm.map(share, self.parts)
        # One reduction for the three: blocks, B, rhs.
        flat = self._sum(sum(np.concatenate([b.ravel(), B.ravel(), r]) for b, B, r in shares))
        blocks = flat[:nb * CC].reshape(nb, C, C)
        diag = flat[nb * CC:nb * CC + nc * CC].reshape(nc, C, C).copy()
        rhs = flat[nb * CC + nc * CC:]
        diag[:, np.arange(C), np.arange(C)] += Dc2
        return solve_reduced(pairs, nc, blocks, diag, rhs, dense=linear_solver(self.o.linear_solver).dense)

    def _solve_pcg(self, Dc2):
        nc, C = self.ev.nc, self.C
        zero = np.zeros((nc, C))
        ops = self.comm.map(lambda p: p.neq.pcg_operator(p.Vinv, zero), self.parts)
        dc2 = Dc2.ravel()

        def apply_S(x):
            return self._sum(sum(op(x) for op, _ in ops)) + dc2 * x
        b = self._sum(sum(rhs for _, rhs in ops))
        Sd = self._sum(sum(p.neq.B - p.neq.diagonal_pair_sums(p.Vinv) for p in self.parts))
        Sd[:, np.arange(C), np.arange(C)] += Dc2
        Pinv = spd_block_inverses(Sd)

        def precondition(v):
            return np.einsum("cij,cj->ci", Pinv, v.reshape(nc, C)).ravel()
        x, ok, its, msg = conjugate_gradients(apply_S, b, precondition, q_tolerance=self.o.eta,
                                              r_tolerance=-1.0, max_iterations=self.o.max_linear_solver_iterations)
        return (x.reshape(nc, C) if x is not None else None), ok, its, msg

    def evaluate_candidate(self):
        t0 = time.perf_counter()
        self.cand_c = self.cams + self.delta_c
        for p in self.parts:
            p.cand = p.pts + p.delta
        costs = self.comm.map(lambda p: p.ev.cost(self._x(p, self.cand_c, p.cand)), self.parts)
        self.ev.num_residual_evaluations += 1
        self.ev.residual_time += time.perf_counter() - t0
        sq_local = sum(float(np.dot(p.pts - p.cand, p.pts - p.cand)) for p in self.parts)
        ok = self._all_ok([c is not None for c in costs])
        cost, sq = self._scalars(sum(c for c in costs if c is not None), sq_local)
        dc = self.cams - self.cand_c
        return (cost if ok else None), (sq + float(np.dot(dc, dc))) ** 0.5

    def accept(self):
        self.cams = self.cand_c
        for p in self.parts:
            p.pts = p.cand

    @property
    def x_norm(self) -> float:
        local = sum(float(np.dot(p.pts, p.pts)) for p in self.parts)
        return (self._scalars(local)[0] + float(np.dot(self.cams, self.cams))) ** 0.5

    def remember_best(self):
        self.best_cams = self.cams.copy()
        self.best_pts = [p.pts.copy() for p in self.parts]

    def best(self, final: bool = True) -> np.ndarray:
        """The best parameters (cameras, then every part's points in order), on every part."""
        local = np.concatenate(self.best_pts) if self.best_pts else np.zeros(0)
        return np.concatenate([self.best_cams, self.comm.concat(local)])

    def kernel_time(self):
        return None             # the device's work is not profiled per kernel here

    def transfers(self) -> dict:
        """``reduced_bytes``: what one part contributed to the reductions, all iterations."""
        return {"reduced_bytes": self.comm.bytes}

    @property
    def linear_solver_detail(self) -> str:
        how = ("reduced camera matrix summed over the parts, factorised on each"
               if not linear_solver(self.o.linear_solver).iterative
               else "Schur products summed over the parts per CG step")
        return describe_split(self.comm, self.parts, how)

    def close(self):
        self.comm.close()


def device_split_reason(evaluators, options):
    """Why the parts cannot keep their states on their devices (None when they can;
    solvers.split.partitioned_device)."""
    from ..ba.lm_device import device_unavailable_reason
    if not linear_solver(options.linear_solver).iterative:
        return (f"a split {options.linear_solver} sums the parts' reduced camera matrices on the host "
                "(iterative_schur keeps the parts on their devices)")
    for ev, rt, lo, hi in evaluators:
        if ev.cam.size == 0:
            return f"the part of points {lo}:{hi} has no observations"
        why = device_unavailable_reason(ev, options, rt)
        if why is not None:
            return why
    return None


def partitioned_state(ev, options, x0, observations, make_evaluator, host_path: bool = True,
                      camera_blocks=None, held=None):
    """The state of a solve split over ``options.devices`` (this process) or the ranks of
    ``options.comm``; ``observations``: the bundle-adjustment core's index fields
    (solvers.ba.observation_index.ObservationIndex); ``make_evaluator(sub_problem, runtime)``: a part's evaluator. The
    parts keep their states on their devices
    (:class:`solvers.split.partitioned_device.PartitionedDeviceState`) wherever ``device_split_reason``
    finds nothing against it on any part (every rank agrees) and ``device_resident`` is not False;
    otherwise they run the host reference (:class:`PartitionedState`), where ``host_path`` allows
    it (nothing held constant). ``camera_blocks`` and ``held`` (``(free
    camera entries (nc, C), free point entries (npt, P), the squared norm |x| leaves out)``): a
    merge's (solvers.general.merged_groups), for the device parts."""
    if options.comm is not None:
        comm = MPIParts(options.comm)
        runtimes = [rank_runtime(options.comm, options.devices)]
        ranges = point_ranges(observations.point_index, observations.num_points, comm.size)[comm.rank:comm.rank + 1]
        first = comm.rank           # the number of this process's first part
    else:
        from clkernels.multi_device import resolve
        runtimes = resolve(options.devices)
        comm = LocalParts(len(runtimes))
        ranges = point_ranges(observations.point_index, observations.num_points, len(runtimes))
        first = 0
    evaluators = part_evaluators(make_evaluator, ev, runtimes, ranges)
    why = "device_resident=False" if options.device_resident is False else device_split_reason(evaluators, options)
    # Every rank must take the same path: one that cannot makes them all take the host's.
    if comm.max(np.array([0.0 if why is None else 1.0]))[0] > 0:
        why = why or "another rank cannot keep its part on its device"
        if options.device_resident is True:
            raise ValueError(f"device_resident=True, but {why}")
        if not host_path:
            raise ValueError(f"this split problem holds entries constant, which only the parts on their devices "
                             f"do (linear_solver='iterative_schur' on devices with fp64), but {why}")
        parts = [Part(e, rt, lo, hi) for e, rt, lo, hi in evaluators]
        return PartitionedState(ev, options, x0, parts, comm)
    from .partitioned_device import DevicePart, PartitionedDeviceState
    x0 = np.asarray(x0, dtype=np.float64)
    C, P = observations.camera_size, observations.point_size
    ncC = C * observations.num_cameras
    parts = []
    for k, (e, rt, lo, hi) in enumerate(evaluators):
        part = DevicePart(e, options, rt, np.concatenate([x0[:ncC], x0[ncC + P * lo:ncC + P * hi]]), lo, hi,
                          counts_cameras=first + k == 0, camera_blocks=camera_blocks)
        if held is not None:
            free_c, free_p, excluded_sq = held
            # |x| leaves the constant entries out once: the part that counts the cameras does.
            part.hold_constant(free_c, np.asarray(free_p)[lo:hi], excluded_sq if first + k == 0 else 0.0)
        parts.append(part)
    return PartitionedDeviceState(ev, options, parts, comm)
