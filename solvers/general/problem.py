"""A nonlinear least-squares problem over named parameter groups, in the manner of Ceres' ``Problem``.

A *parameter group* is a table of rows, ``(num_rows, size)``: every row is one of Ceres'
parameter blocks (one pose, one camera's intrinsics, one point). A *residual kind* is one
pyclad-traceable function ``fn(*rows, data) -> list of residuals`` applied to many tuples of rows,
one per residual block, chosen by ``index``; one compiled kernel evaluates every block of a kind,
and every Jacobian block comes from pyclad.

    import numpy as np, solvers
    prob = solvers.Problem()
    poses = prob.add_parameter_block("poses", poses0)              # (n_images, 6)
    intr = prob.add_parameter_block("intrinsics", intr0)           # (n_cameras, k), shared
    pts = prob.add_parameter_block("points", points0)              # (n_points, 3)
    prob.add_residual_block(fn, [poses, intr, pts], index=(img, cam, pt), data=observed,
                            loss="huber", loss_scale=1.0, name="reprojection")
    prob.set_constant("poses", rows=[0])                           # whole rows
    prob.set_constant("intrinsics", columns=[0])                   # an entry of every row
    result = solvers.solve(prob, linear_solver="sparse_schur", eliminate="points")

Constant rows are Ceres' constant parameter blocks: they are not part of the state. Constant
columns are Ceres' ``SubsetManifold``: the rows keep them, but they take no step and get no
Jacobian column. :func:`solvers.solve` runs the iterations.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence

import numpy as np

from ..checks import first_not_finite
from ..models.loss import Loss


class ParameterBlock:
    """A named group of parameter rows in a :class:`Problem`: a ``(num_rows, size)`` table whose
    rows are Ceres' parameter blocks.

    Returned by :meth:`Problem.add_parameter_block`, which makes it; pass it (or its name) to
    :meth:`Problem.add_residual_block` and :meth:`Problem.set_constant`. A solve does not change
    it: the optimised tables are the result's ``parameters``, and
    :meth:`Problem.set_parameters` replaces ``values``.

    Args:
        name: the group's name in its problem.
        values: the ``(num_rows, size)`` float64 table.

    Attributes:
        name: the group's name in its problem.
        values: ``(num_rows, size)`` float64, the starting values: the problem's own copy (or
            the caller's array with ``add_parameter_block(..., copy=False)``).
        constant_rows: ``(num_rows,)`` bool, the rows held constant (Ceres' constant blocks).
        constant_columns: ``(size,)`` bool, the entries held constant in every row (Ceres'
            ``SubsetManifold``).
        constant_entries: ``(num_rows, size)`` bool, entries held constant in some rows only
            (:meth:`Problem.set_constant` with both rows and columns), or None when there are
            none.
    """

    def __init__(self, name: str, values: np.ndarray):
        self.name = name
        self.values = values
        self.constant_rows = np.zeros(values.shape[0], bool)
        self.constant_columns = np.zeros(values.shape[1], bool)
        # Entries constant in some rows only (set_constant with rows and columns), or None.
        self.constant_entries = None

    @property
    def num_rows(self) -> int:
        """The number of rows."""
        return self.values.shape[0]

    @property
    def size(self) -> int:
        """Parameters per row."""
        return self.values.shape[1]

    @property
    def free_rows(self) -> np.ndarray:
        """The indices of the rows not held constant as a whole."""
        return np.flatnonzero(~self.constant_rows)

    @property
    def free_columns(self) -> np.ndarray:
        """The indices of the entries not held constant in every row."""
        return np.flatnonzero(~self.constant_columns)

    @property
    def is_constant(self) -> bool:
        """No entry of any row takes a step."""
        return bool(self.constant_rows.all() or self.constant_columns.all())

    @property
    def has_entry_constants(self) -> bool:
        """Some rows have constant entries of their own (set_constant with rows and columns)."""
        return self.constant_entries is not None and bool(self.constant_entries.any())

    @property
    def has_constants(self) -> bool:
        """Anything of this group is constant: rows, columns or single entries."""
        return bool(self.constant_rows.any() or self.constant_columns.any()) or self.has_entry_constants

    def free_mask(self) -> np.ndarray:
        """(num_rows, size) bool: the entries that take a step (rows set constant excluded)."""
        m = np.repeat(~self.constant_columns[None, :], self.num_rows, axis=0)
        if self.constant_entries is not None:
            m &= ~self.constant_entries
        m[self.constant_rows] = False
        return m

    def __repr__(self):
        return f"ParameterBlock({self.name!r}, {self.num_rows} x {self.size})"


@dataclasses.dataclass
class ResidualBlock:
    """One residual kind: ``fn`` over the rows ``index[:, j]`` of ``groups[j]`` with per-block
    ``data``, under ``loss``, one residual block per row of ``index``.

    Returned by :meth:`Problem.add_residual_block`, which makes it and checks its arguments.

    Attributes:
        name: the kind's name: ``add_residual_block``'s ``name``, else the function's
            ``__name__`` (``"residual"`` without one), with ``_K`` appended (K the number of
            kinds before it) when another kind has that name.
        fn: the pyclad-traceable function ``fn(*rows, data) -> list of residuals``.
        groups: the :class:`ParameterBlock` of each of ``fn``'s row arguments, in order (a group
            may appear twice).
        columns: per entry of ``groups``, the ``(n,)`` int32 row of that group that each of the
            n residual blocks takes (contiguous).
        data: ``(n, d)`` float64 per-block constants, or None.
        loss: the :class:`solvers.Loss` of every block of the kind.
        num_residuals: the residuals per block; 0 until the function is traced.
    """
    name: str
    fn: object
    groups: List[ParameterBlock]
    columns: List[np.ndarray]    # per group slot, the (n,) int32 rows (contiguous)
    data: Optional[np.ndarray]   # (n, d) float64, or None
    loss: Loss
    num_residuals: int = 0       # per block; found when the function is traced
    _index: Optional[np.ndarray] = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def num_blocks(self) -> int:
        """The number of residual blocks, n."""
        return self.columns[0].size

    @property
    def index(self) -> np.ndarray:
        """(n, len(groups)) int32: what the kind's BatchFunction takes (made once)."""
        if self._index is None:
            from ..ba import ordering
            self._index = ordering.columns(self.columns, np.int32)
        return self._index


def _name_of(group) -> str:
    return group.name if isinstance(group, ParameterBlock) else group


class Problem:
    """Parameter groups and residual kinds; see the module docstring.

    ``dtype`` is the type the residuals and Jacobians are evaluated in (float32 for devices
    without fp64); ``device`` the OpenCL device (None: ``PYCLAD_DEVICE`` or the first one);
    ``backend`` pyclad's (``"auto"``, ``"codegen"``, ``"tape"`` or ``"numpy"``).
    """

    def __init__(self, dtype=np.float64, device=None, backend: str = "auto", name: str = "problem"):
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise TypeError(f"dtype must be np.float32 or np.float64, got {self.dtype}")
        self.device, self.backend, self.name = device, backend, name
        self.groups: dict = {}
        self.residuals: List[ResidualBlock] = []
        # What the problem's maker wants said before the solve's log (solvers.colmap's alignment
        # to pose priors, say): solve(verbose=True) prints them first.
        self.notes: List[str] = []

    # -- building --------------------------------------------------------------------------
    def add_parameter_block(self, name: str, values, copy: bool = True) -> ParameterBlock:
        """A group of rows ``values`` (``(num_rows, size)``, or ``(size,)`` for one row), copied
        as float64 (``copy=False`` shares a float64 C-contiguous array: the caller must not change
        it while the problem is in use)."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"add_parameter_block: name must be a non-empty string, got {name!r}")
        if name in self.groups:
            raise ValueError(f"add_parameter_block: a group named {name!r} exists already; "
                             f"the groups are {list(self.groups)}")
        v = np.array(values, dtype=np.float64, copy=True) if copy else np.ascontiguousarray(values, np.float64)
        if v.ndim == 1:
            v = v[None, :]
        if v.ndim != 2 or v.shape[1] < 1:
            raise ValueError(f"add_parameter_block({name!r}): values must be (num_rows, size) with "
                             f"size >= 1, got shape {np.shape(values)}")
        if not np.all(np.isfinite(v)):
            bad = np.argwhere(~np.isfinite(v))[0]
            raise ValueError(f"add_parameter_block({name!r}): values[{bad[0]}, {bad[1]}] is "
                             f"{v[bad[0], bad[1]]}; every starting value must be finite")
        block = ParameterBlock(name, v)
        self.groups[name] = block
        return block

    def group(self, group) -> ParameterBlock:
        """The group of a name or a :class:`ParameterBlock` of this problem."""
        name = _name_of(group)
        if not isinstance(name, str) or name not in self.groups or \
                (isinstance(group, ParameterBlock) and self.groups[name] is not group):
            raise KeyError(f"{group!r} is not a parameter group of this problem; "
                           f"its groups are {list(self.groups)}")
        return self.groups[name]

    def add_residual_block(self, fn, groups: Sequence, index, data=None, loss=None,
                           loss_scale: float = 1.0, name: Optional[str] = None, copy: bool = True,
                           index_checked: bool = False) -> ResidualBlock:
        """Residual blocks ``fn(groups[0][index[0][i]], ..., data[i])`` for every ``i``.

        - ``groups``: the parameter groups (names or :class:`ParameterBlock`) ``fn`` takes, in
          order; a group may appear twice (e.g. two poses of a relative-pose residual).
        - ``index``: one row-index array per group (a tuple of ``(n,)`` arrays, or an ``(n, G)``
          array).
        - ``data``: ``(n, d)`` per-block constants (observed pixels), or None.
        - ``loss``: None/"trivial", "huber", "cauchy", "soft_l1" or a :class:`solvers.Loss`,
          with ``loss_scale``.
        - ``copy=False`` shares ``data`` where it is float64 and C-contiguous (see
          :meth:`add_parameter_block`); the index is always kept as int32 arrays of its own.
        - ``index_checked=True`` skips the range check of ``index`` (two passes over every array)
          for indices the caller has checked, as :class:`solvers.BALProblem` does when it is made;
          an index out of range would then read outside the parameter tables on the device.
        """
        if not callable(fn):
            raise TypeError(f"add_residual_block: fn must be a function of the parameter rows "
                            f"(and data), got {type(fn).__name__}")
        if isinstance(groups, (str, ParameterBlock)):
            groups = [groups]
        blocks = [self.group(g) for g in groups]
        if not blocks:
            raise ValueError("add_residual_block: groups is empty; a residual needs at least one group")
        label = name or getattr(fn, "__name__", "residual")
        if any(r.name == label for r in self.residuals):
            label = f"{label}_{len(self.residuals)}"
        cols = self._index(index, blocks, label, index_checked)
        n = cols[0].size
        d = None
        if data is not None:
            d = np.array(data, dtype=np.float64, copy=True) if copy else np.ascontiguousarray(data, np.float64)
            if d.ndim == 1:
                d = d[:, None]
            if d.ndim != 2 or d.shape[0] != n:
                raise ValueError(f"add_residual_block({label!r}): data must be (n, d) with one row "
                                 f"per residual block ({n}), got shape {np.shape(data)}")
            if d.shape[1] == 0:
                d = None
            elif (row := first_not_finite(d)) is not None:   # named here: on the device it is only "evaluation failed"
                raise ValueError(f"add_residual_block({label!r}): data row {row} holds a value that is not "
                                 f"finite ({d[row].tolist()}); remove that residual block or fix its data")
        lo = loss if isinstance(loss, Loss) else Loss(loss or "trivial", loss_scale)
        block = ResidualBlock(label, fn, blocks, cols, d, lo)
        self.residuals.append(block)
        return block

    @staticmethod
    def _index(index, blocks, label, checked=False) -> List[np.ndarray]:
        from ..ba import ordering
        G = len(blocks)
        if isinstance(index, np.ndarray) and index.ndim == 2:
            cols = [index[:, j] for j in range(index.shape[1])]
        elif isinstance(index, np.ndarray) and index.ndim == 1 and G == 1:
            cols = [index]
        else:
            cols = list(index)
        if len(cols) != G:
            raise ValueError(f"add_residual_block({label!r}): index has {len(cols)} row-index arrays "
                             f"for {G} groups; give one per group, in the order of groups")
        out = []
        n = None
        for j, (c, b) in enumerate(zip(cols, blocks)):
            c = np.asarray(c)
            if c.ndim != 1:
                raise ValueError(f"add_residual_block({label!r}): index[{j}] must be 1-D, got shape {c.shape}")
            if c.size and not np.issubdtype(c.dtype, np.integer):
                raise TypeError(f"add_residual_block({label!r}): index[{j}] must hold integers "
                                f"(row numbers of {b.name!r}), got {c.dtype}")
            if n is None:
                n = c.size
            elif c.size != n:
                raise ValueError(f"add_residual_block({label!r}): index[{j}] has {c.size} entries, "
                                 f"index[0] {n}; every index array needs one per residual block")
            if not checked and c.size and (c.min() < 0 or c.max() >= b.num_rows):
                bad = int(np.flatnonzero((c < 0) | (c >= b.num_rows))[0])
                raise IndexError(f"add_residual_block({label!r}): index[{j}][{bad}] = {int(c[bad])} "
                                 f"is not a row of {b.name!r}, which has {b.num_rows} rows")
            out.append(ordering.converted(c, np.int32))
        return out

    def set_constant(self, group, rows=None, columns=None) -> None:
        """Hold parameters fixed: whole ``rows`` of ``group`` (Ceres' constant blocks), the
        entries ``columns`` of every row (Ceres' SubsetManifold), or, given both, the entries
        ``columns`` of the rows ``rows`` only (e.g. one coordinate of one pose, as a gauge).
        Neither: the whole group."""
        b = self.group(group)
        if rows is None and columns is None:
            b.constant_rows[:] = True
            return
        if rows is not None and columns is not None:
            r, c = self._rows(b, rows), self._columns(b, columns)
            if b.constant_entries is None:
                b.constant_entries = np.zeros(b.values.shape, bool)
            b.constant_entries[np.ix_(r, c)] = True
            return
        if rows is not None:
            b.constant_rows[self._rows(b, rows)] = True
        if columns is not None:
            b.constant_columns[self._columns(b, columns)] = True

    @staticmethod
    def _rows(b, rows) -> np.ndarray:
        r = np.atleast_1d(np.asarray(rows))
        if r.dtype == bool:
            if r.shape != (b.num_rows,):
                raise ValueError(f"set_constant({b.name!r}): a boolean rows mask needs {b.num_rows} "
                                 f"entries, got {r.shape}")
            r = np.flatnonzero(r)
        if r.size and (not np.issubdtype(r.dtype, np.integer) or r.min() < -b.num_rows or r.max() >= b.num_rows):
            raise IndexError(f"set_constant({b.name!r}): rows {r.tolist()[:8]} are not rows of a "
                             f"group with {b.num_rows} rows")
        return r

    @staticmethod
    def _columns(b, columns) -> np.ndarray:
        c = np.atleast_1d(np.asarray(columns))
        if c.dtype == bool:
            c = np.flatnonzero(c)
        if c.size and (not np.issubdtype(c.dtype, np.integer) or c.min() < -b.size or c.max() >= b.size):
            raise IndexError(f"set_constant({b.name!r}): columns {c.tolist()} are not entries of "
                             f"rows of size {b.size}")
        return c

    def set_variable(self, group, rows=None, columns=None) -> None:
        """Undo :meth:`set_constant` (neither ``rows`` nor ``columns``: the whole group)."""
        b = self.group(group)
        if rows is None and columns is None:
            b.constant_rows[:] = False
            b.constant_columns[:] = False
            b.constant_entries = None
            return
        if rows is not None and columns is not None:
            if b.constant_entries is not None:
                b.constant_entries[np.ix_(self._rows(b, rows), self._columns(b, columns))] = False
            return
        if rows is not None:
            b.constant_rows[self._rows(b, rows)] = False
        if columns is not None:
            b.constant_columns[self._columns(b, columns)] = False

    # -- what the solver asks ------------------------------------------------------------
    @property
    def num_residual_blocks(self) -> int:
        return sum(r.num_blocks for r in self.residuals)

    def parameters(self) -> dict:
        """Copies of every group's current values."""
        return {k: g.values.copy() for k, g in self.groups.items()}

    def set_parameters(self, parameters: dict) -> None:
        """New starting values, e.g. ``result.parameters`` of an earlier solve: a table per
        group name (groups not named keep theirs). Shapes must match; values must be finite."""
        for name, v in parameters.items():
            g = self.group(name)
            v = np.asarray(v, dtype=np.float64)
            if v.shape != g.values.shape:
                raise ValueError(f"set_parameters: {name!r} must be {g.values.shape}, got {v.shape}")
            if not np.all(np.isfinite(v)):
                raise ValueError(f"set_parameters: {name!r} has values that are not finite")
        for name, v in parameters.items():
            self.groups[name].values = np.array(v, dtype=np.float64, copy=True)

    def eliminable(self) -> List[str]:
        """The groups the Schur complement may remove: not constant, the same entries free in
        every row, and no residual block touches two rows of them (a kind that takes the group
        twice disqualifies it)."""
        out = []
        for name, g in self.groups.items():
            if g.is_constant or g.has_entry_constants:
                continue
            uses = [sum(1 for b in r.groups if b is g) for r in self.residuals]
            if all(u <= 1 for u in uses) and any(uses):
                out.append(name)
        return out

    def choose_eliminated(self, eliminate) -> Optional[str]:
        """The group to eliminate: a name, ``"auto"`` (Ceres' choice: the eliminable group with
        the most rows) or None (eliminate nothing)."""
        if eliminate is None:
            return None
        candidates = self.eliminable()
        if eliminate == "auto":
            # Eliminating the only variable group would leave nothing to reduce to.
            variable = [k for k, g in self.groups.items() if not g.is_constant]
            if not candidates or len(variable) < 2:
                return None
            return max(candidates, key=lambda k: (self.groups[k].free_rows.size, -list(self.groups).index(k)))
        name = _name_of(eliminate)
        self.group(name)
        if name not in candidates:
            g = self.groups[name]
            why = ("all of it is constant" if g.is_constant else
                   "some of its rows have their own constant entries" if g.has_entry_constants else
                   "no residual uses it" if not any(g in r.groups for r in self.residuals) else
                   "a residual block touches two of its rows")
            raise ValueError(f"eliminate={name!r} cannot be eliminated: {why}; eliminable groups: "
                             f"{candidates}, or eliminate='auto'")
        return name

    def check(self) -> None:
        """Refuse a problem the solver cannot run: no residuals. (Rows no residual uses are
        held where they are, as Ceres drops parameter blocks without residuals.)"""
        if not self.residuals:
            raise ValueError("the problem has no residual blocks; add some with add_residual_block")

    def __repr__(self):
        gs = ", ".join(f"{k} {g.num_rows}x{g.size}" for k, g in self.groups.items())
        rs = ", ".join(f"{r.name} x{r.num_blocks}" for r in self.residuals)
        return f"Problem(groups: {gs}; residuals: {rs})"
