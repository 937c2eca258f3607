"""The state vector of a :class:`solvers.Problem` and its evaluation: cost, residuals and Jacobian
blocks of every residual kind, with Ceres' robust-loss correction.

Layout (:class:`Layout`), in the order the Schur complement wants it: the groups that are not
eliminated, in the order they were added, then the eliminated group.

- The *state* ``x`` holds the active rows of every group whole (Ceres' ambient parameters): a row
  is active when it is not constant and some residual block uses it (Ceres drops parameter blocks
  that no residual uses, and constant ones).
- The *tangent* space holds only the free entries of the active rows (constant columns, Ceres'
  ``SubsetManifold``, take no step and get no Jacobian column).
"""
from __future__ import annotations

import dataclasses
import time
from typing import List, Optional

import numpy as np

from ..models.cameras import cached_batch_function
from ..models.loss import correct


@dataclasses.dataclass
class GroupLayout:
    name: str
    size: int                   # parameters per row
    rows: np.ndarray            # the active rows
    rank: np.ndarray            # row -> its position among the active rows, -1 if inactive
    free: np.ndarray            # the free columns (of every row; see tangent for single rows)
    x_offset: int               # where its rows start in x
    t_offset: int               # where its free entries start in the tangent space
    t_size: int                 # its free entries
    tangent: np.ndarray         # (num_rows, size): each entry's tangent index, -1 if it takes no step

    @property
    def x_size(self) -> int:
        return self.rows.size * self.size


class Layout:
    """Where every group's rows and free entries live in ``x`` and in the tangent space."""

    def __init__(self, problem, eliminated: Optional[str]):
        used = {name: np.zeros(g.num_rows, bool) for name, g in problem.groups.items()}
        for r in problem.residuals:
            for j, g in enumerate(r.groups):
                used[g.name][r.columns[j]] = True
        names = [k for k in problem.groups if k != eliminated] + ([eliminated] if eliminated else [])
        self.groups: List[GroupLayout] = []
        xo = to = 0
        t_in_x = []
        for name in names:
            g = problem.groups[name]
            mask = g.free_mask()
            mask[~used[name]] = False
            active = mask.any(axis=1)
            rows = np.flatnonzero(active)
            rank = np.full(g.num_rows, -1, np.int64)
            rank[rows] = np.arange(rows.size)
            m = mask[rows]
            tangent = np.full(g.values.shape, -1, np.int64)
            count = int(m.sum())
            tangent[rows] = np.where(m, to + np.cumsum(m.ravel()).reshape(m.shape) - 1, -1)
            free = np.flatnonzero(m[0]) if rows.size else g.free_columns
            gl = GroupLayout(name, g.size, rows, rank, free, xo, to, count, tangent)
            # Positions in x of the tangent entries, in tangent order (row-major).
            t_in_x.append(xo + np.flatnonzero(m.ravel()))
            xo += gl.x_size
            to += count
            self.groups.append(gl)
        self.by_name = {g.name: g for g in self.groups}
        self.x_size, self.t_size = xo, to
        self.eliminated = eliminated
        self.t_in_x = np.concatenate(t_in_x).astype(np.int64) if t_in_x else np.zeros(0, np.int64)
        self.num_f = sum(g.t_size for g in self.groups if g.name != eliminated)

    def x0(self, problem) -> np.ndarray:
        return self.x_from_tables({name: g.values for name, g in problem.groups.items()})

    def x_from_tables(self, tables: dict) -> np.ndarray:
        """The state vector at the groups' tables (by name): their active rows, in x's order."""
        return np.concatenate([tables[g.name][g.rows].ravel() for g in self.groups]) \
            if self.groups else np.zeros(0)

    def values(self, problem, x, name) -> np.ndarray:
        """The group's full table at state ``x`` (inactive rows from the problem)."""
        g = problem.groups[name]
        gl = self.by_name[name]
        if gl.rows.size == 0:
            return g.values
        v = g.values.copy()
        v[gl.rows] = x[gl.x_offset:gl.x_offset + gl.x_size].reshape(-1, gl.size)
        return v

    def tangent_to_x(self, delta) -> np.ndarray:
        """A tangent vector as a state-sized one (zero at the constant entries)."""
        out = np.zeros(self.x_size)
        out[self.t_in_x] = delta
        return out


def batch_function(fn, sizes, data: int, dtype, backend, device):
    """The pyclad ``BatchFunction`` of a residual function ``fn(*rows[, data])`` (traced, and its
    kernels built, once per process for each function, sizes, dtype, backend and device)."""
    name = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', 'residual')}"
    return cached_batch_function(name, fn, tuple(sizes), data, dtype, backend, device)


def residual_function(block, dtype, backend, device):
    """:func:`batch_function` of a residual kind."""
    data = 0 if block.data is None else block.data.shape[1]
    return batch_function(block.fn, [g.size for g in block.groups], data, dtype, backend, device)


class ProblemEvaluator:
    """Cost, and corrected residuals and Jacobians, of every residual kind at a state ``x``;
    counts and times the evaluations as :class:`solvers.ba.evaluator.Evaluator` does."""

    def __init__(self, problem, layout: Layout, device=None):
        """``device``: the solve's runtime (solvers.plan.resolve_device), else the problem's."""
        self.problem, self.layout = problem, layout
        device = problem.device if device is None else device
        self.functions = [residual_function(r, problem.dtype, problem.backend, device)
                          for r in problem.residuals]
        for r, f in zip(problem.residuals, self.functions):
            r.num_residuals = f.n_outputs
        self.data = [None if r.data is None else np.ascontiguousarray(r.data, problem.dtype)
                     for r in problem.residuals]
        self.num_residual_evaluations = self.num_jacobian_evaluations = 0
        self.residual_time = self.jacobian_time = 0.0

    def _params(self, x, block):
        tables = {}
        out = []
        for g in block.groups:
            if g.name not in tables:
                tables[g.name] = np.ascontiguousarray(self.layout.values(self.problem, x, g.name),
                                                      self.problem.dtype)
            out.append(tables[g.name])
        return out

    def cost(self, x) -> Optional[float]:
        """Cost at ``x``; None when a residual is not finite (Ceres: the evaluation failed)."""
        t0 = time.perf_counter()
        try:
            total = 0.0
            for block, f, d in zip(self.problem.residuals, self.functions, self.data):
                r = np.asarray(f.values(self._params(x, block), block.index, data=d), np.float64)
                if not np.all(np.isfinite(r)):
                    return None
                total += block.loss.cost(np.einsum("ij,ij->i", r, r))
            return total if np.isfinite(total) else None
        finally:
            self.num_residual_evaluations += 1
            self.residual_time += time.perf_counter() - t0

    def evaluate(self, x):
        """``(cost, [(r, [J per group slot]) per kind])``, corrected for the losses; None when
        anything is not finite."""
        t0 = time.perf_counter()
        try:
            total, kinds = 0.0, []
            for block, f, d in zip(self.problem.residuals, self.functions, self.data):
                r, jacs = f.values_and_jacobians(self._params(x, block), block.index, data=d)
                r = np.asarray(r, np.float64)
                jacs = [np.asarray(j, np.float64) for j in jacs]
                if not (np.all(np.isfinite(r)) and all(np.all(np.isfinite(j)) for j in jacs)):
                    return None
                cost, r, jacs = correct(block.loss, r, jacs)
                total += cost
                kinds.append((r, jacs))
            if not np.isfinite(total):
                return None
            return total, kinds
        finally:
            self.num_jacobian_evaluations += 1
            self.jacobian_time += time.perf_counter() - t0
