"""Groups that one residual kind always uses together, taken as one camera group, so that the
bundle-adjustment core (:mod:`solvers.ba.lm_device`, device-resident) solves problems such as a
COLMAP reconstruction with a camera per image.

A COLMAP reprojection reads a pose, the image's intrinsics and a point. When every image has a
camera of its own, each pose row always meets the same intrinsics row: the pair is one
"camera" of ``6 + k`` parameters, and the problem has the bundle adjuster's structure (one
camera and one point per observation). What the general core would hold constant (the gauge's
pose, the principal point) becomes a mask of the merged rows' entries: their Jacobian columns
are zeroed on the device (:meth:`solvers.ba.lm_device.DeviceState.hold_constant`), so they take no
step (a zero column and a zero gradient entry decouple from the rest of the system); the eliminated
group's constant entries (a fixed point) likewise.

A row that several merged rows hold (a camera that many images share) has a copy in each of them:
the device sums the copies' gradients and column norms and solves sparse_schur for the problem's
columns (:class:`solvers.general.key_copies_device.KeyCopies`), so the iterations are the general core's; the
merged rows are then keys, the tuples of rows that observations use (``copies``).

Not mergeable, and left to the general core: several residual kinds, a group in two slots of the
kind, and shared rows where copies are not taken (``shared=False``).
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np

_wrappers = {}


def _merged_function(fn, sizes, e_slot):
    """``fn`` over one merged row (the non-eliminated slots' rows side by side, ``sizes`` wide,
    in slot order) and the eliminated row, camera first: one wrapper per layout, so that its
    kernel is cached like ``fn``'s."""
    key = (fn, tuple(sizes), e_slot)
    if key not in _wrappers:
        offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()

        def merged(camera, point, *data):
            rows = [camera[offsets[i]:offsets[i + 1]] for i in range(len(sizes))]
            rows.insert(e_slot, point)
            return fn(*rows, *data)
        merged.__name__ = merged.__qualname__ = \
            f"{getattr(fn, '__qualname__', 'residual')}_merged_{'_'.join(map(str, sizes))}_{e_slot}"
        merged.__module__ = getattr(fn, "__module__", None)
        _wrappers[key] = merged
    return _wrappers[key]


class MergedGroups:
    """The merge of ``problem``'s non-eliminated groups (module docstring): ``problem`` (a new
    :class:`solvers.Problem` over the merged group and the eliminated one), ``free`` and
    ``free_points`` (the entries of the merged rows and of the eliminated group that take a
    step), ``excluded_sq`` (the squared norm of the entries that the original problem's state
    leaves out: rows with nothing free, unused points), and :meth:`parameters`, which splits a
    solution back into the original groups."""

    def __init__(self, original, block, e_slot: int, keys: np.ndarray, key_rows: List[np.ndarray]):
        from .problem import Problem
        self.original, self.block = original, block
        self.slots = [(j, g) for j, g in enumerate(block.groups) if j != e_slot]
        self.key_rows = key_rows                      # per slot: the group row of every merged row
        values = np.concatenate([g.values[r] for (_, g), r in zip(self.slots, key_rows)], axis=1)
        masks = [g.free_mask()[r] for (_, g), r in zip(self.slots, key_rows)]
        self.free = np.concatenate(masks, axis=1)
        e = block.groups[e_slot]
        self.free_points = e.free_mask()
        # Each merged entry's original (slot, row, entry) as one id; the copies of an id, where
        # rows are shared: (the problem column of each merged entry, -1 where constant; the one
        # copy of each id that the norms count), else None.
        bases = np.concatenate([[0], np.cumsum([g.num_rows * g.size for _, g in self.slots])])
        ids = np.concatenate([base + r[:, None] * g.size + np.arange(g.size)[None, :]
                              for base, (_, g), r in zip(bases, self.slots, key_rows)], axis=1).ravel()
        distinct, first = np.unique(ids, return_index=True)
        count = np.zeros(ids.size, bool)
        count[first] = True
        self.copies = None
        if distinct.size < ids.size:
            free = self.free.ravel()
            columns = np.unique(ids[free])
            column = np.full(ids.size, -1, np.int64)
            column[free] = np.searchsorted(columns, ids[free])
            self.copies = (column, count)
            self.num_columns = columns.size
        # The original problem's state holds only the rows that are not constant and that some
        # residual uses (Ceres drops the others): their entries stay out of |x|, which the device
        # sums over one copy of each entry (count).
        held = np.concatenate([np.repeat(~m.any(axis=1)[:, None], g.size, axis=1)
                               for m, (_, g) in zip(masks, self.slots)], axis=1)
        used = np.zeros(e.num_rows, bool)
        used[block.columns[e_slot]] = True
        dropped = ~self.free_points.any(axis=1) | ~used
        self.excluded_sq = float(np.sum((values.ravel() ** 2)[held.ravel() & count])
                                 + np.sum(e.values[dropped] ** 2))
        sizes = self.block_sizes = [g.size for _, g in self.slots]
        name = "+".join(g.name for _, g in self.slots)
        p = Problem(dtype=original.dtype, device=original.device, backend=original.backend, name=original.name)
        cam = p.add_parameter_block(name, values, copy=False)
        cam.constant_entries = ~self.free
        pt = p.add_parameter_block(e.name, e.values, copy=False)
        pt.constant_entries = ~self.free_points
        p.add_residual_block(_merged_function(block.fn, sizes, e_slot), [cam, pt],
                             index=(keys, block.columns[e_slot]), data=block.data, loss=block.loss,
                             name=block.name, copy=False, index_checked=True)
        self.problem = p
        self.merged_name = name

    def parameters(self, solved: dict) -> dict:
        """Every original group's table from the merged problem's ``solved`` tables."""
        cams = solved[self.merged_name]
        out = {k: v for k, v in solved.items() if k != self.merged_name}
        offset = 0
        for (_, g), rows in zip(self.slots, self.key_rows):
            table = g.values.copy()
            table[rows] = cams[:, offset:offset + g.size]
            out[g.name] = table
            offset += g.size
        for k, g in self.original.groups.items():
            out.setdefault(k, g.values.copy())
        return out


def merge_groups(problem, eliminated: Optional[str], shared: bool = False) -> Optional[MergedGroups]:
    """The merge of ``problem`` when it has the structure of the module docstring, else None;
    ``shared``: rows that several merged rows hold are taken (as copies)."""
    if eliminated is None or len(problem.residuals) != 1:
        return None
    block = problem.residuals[0]
    names = [g.name for g in block.groups]
    if len(set(names)) != len(names) or eliminated not in names or len(names) < 2:
        return None
    e_slot = names.index(eliminated)
    # Groups outside the kind take no step (Ceres drops blocks no residual uses): nothing to do.
    rows = [block.columns[j] for j in range(len(names)) if j != e_slot]
    # The merged rows: the distinct tuples of the non-eliminated rows, in their order (each
    # tuple coded as one integer, mixed radix over the groups' row counts).
    sizes = [g.num_rows for j, g in enumerate(block.groups) if j != e_slot]
    bound = int(np.prod([max(1, s) for s in sizes], dtype=object))
    if bound >= 2 ** 62:
        return None
    code = np.zeros(block.num_blocks, np.int64)
    for r, s in zip(rows, sizes):
        code = code * s + r
    from .pair_schur import unique_inverse
    codes, keys = unique_inverse(code, bound)
    keys = keys.astype(np.int32)
    uniq = np.empty((codes.size, len(rows)), np.int64)
    for j in range(len(rows) - 1, -1, -1):
        uniq[:, j] = codes % sizes[j]
        codes = codes // sizes[j]
    # Without copies no row may belong to two merged rows: each slot's rows distinct across keys.
    if not shared:
        for j in range(uniq.shape[1]):
            if np.unique(uniq[:, j]).size != uniq.shape[0]:
                return None
    return MergedGroups(problem, block, e_slot, keys, [uniq[:, j] for j in range(uniq.shape[1])])
