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

Further residual kinds over some of the merged groups only (a position prior on a pose, no
eliminated row) join the one kind (:func:`_union_function`): every residual block evaluates one
function that picks its kind's residual by a tag in its data (padded with zeros to the widest
kind), and a block of such a kind observes a constant point of its own (zeros), so that the
bundle-adjustment core's one-camera-one-point structure holds; that point is dropped again from
the solution, and the report counts the original problem's residuals. The kinds must share
their robust loss.

Not mergeable, and left to the general core: several kinds that use the eliminated group, kinds
of different losses, a group in two slots of the kind, and shared rows where copies are not
taken (``shared=False``).
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


_unions = {}


def _union_function(main_fn, main_data: int, others):
    """One residual function for the main kind (``main_fn(*rows[, data])``, ``main_data`` wide)
    and the ``others``, each ``(fn, slots, data width, residuals)`` over some of the main kind's
    non-eliminated slots (indices into its rows): ``data = [tag, main data, each other's data]``, tag 0 the main
    kind, k the k-th other; the residuals padded with zeros to the widest kind's. Cached per
    layout, so its kernel is too."""
    key = (main_fn, main_data, tuple((fn, tuple(slots), d, r) for fn, slots, d, r in others))
    if key not in _unions:
        import pyclad as pc

        def union(*args):
            *rows, data = args          # the main kind's rows, in its slot order; the tagged data
            main = main_fn(*rows, *([data[1:1 + main_data]] if main_data else []))
            picked = list(main)
            offset = 1 + main_data
            width = max([len(main)] + [r for *_, r in others])
            picked += [0.0] * (width - len(picked))
            for k, (fn, slots, d, r) in enumerate(others, start=1):
                out = fn(*[rows[j] for j in slots], *([data[offset:offset + d]] if d else []))
                out = list(out) + [0.0] * (width - len(out))
                is_k = data[0] == float(k)
                picked = [pc.where(is_k, o, m) for o, m in zip(out, picked)]
                offset += d
            return picked
        union.__name__ = union.__qualname__ = f"{getattr(main_fn, '__qualname__', 'residual')}_with_{len(others)}_more"
        union.__module__ = getattr(main_fn, "__module__", None)
        _unions[key] = union
    return _unions[key]


class MergedGroups:
    """The merge of ``problem``'s non-eliminated groups (module docstring): ``problem`` (a new
    :class:`solvers.Problem` over the merged group and the eliminated one), ``free`` and
    ``free_points`` (the entries of the merged rows and of the eliminated group that take a
    step), ``excluded_sq`` (the squared norm of the entries that the original problem's state
    leaves out: rows with nothing free, unused points), and :meth:`parameters`, which splits a
    solution back into the original groups."""

    def __init__(self, original, block, e_slot: int, keys: np.ndarray, key_rows: List[np.ndarray]):
        from .problem import Problem
        self.original, self.block, self.e_slot = original, block, e_slot
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
        if isinstance(self.block, _UnionBlock):       # the other kinds' constant points dropped
            name = self.block.groups[self.e_slot].name
            out[name] = out[name][:self.block.original_point_rows]
        offset = 0
        for (_, g), rows in zip(self.slots, self.key_rows):
            table = g.values.copy()
            table[rows] = cams[:, offset:offset + g.size]
            out[g.name] = table
            offset += g.size
        for k, g in self.original.groups.items():
            out.setdefault(k, g.values.copy())
        return out


class _UnionBlock:
    """The main kind and the others as one kind (module docstring): what :class:`MergedGroups`
    reads of a residual block, with the eliminated group extended by one constant zero row per
    block of the other kinds."""

    def __init__(self, main, e_slot, others):
        from .problem import ParameterBlock
        e = main.groups[e_slot]
        n_extra = sum(o.num_blocks for o, _ in others)
        self.original_point_rows = e.num_rows
        points = ParameterBlock(e.name, np.concatenate([e.values, np.zeros((n_extra, e.size))]))
        points.constant_entries = np.concatenate([~e.free_mask(), np.ones((n_extra, e.size), bool)])
        self.groups = [points if j == e_slot else g for j, g in enumerate(main.groups)]
        main_data = 0 if main.data is None else main.data.shape[1]
        widths = [0 if o.data is None else o.data.shape[1] for o, _ in others]
        n_main = main.num_blocks
        data = np.zeros((n_main + n_extra, 1 + main_data + sum(widths)))
        if main_data:
            data[:n_main, 1:1 + main_data] = main.data
        columns = [np.array(c) for c in main.columns]
        start, offset = n_main, 1 + main_data
        for k, ((o, slots), d) in enumerate(zip(others, widths), start=1):
            stop = start + o.num_blocks
            data[start:stop, 0] = k
            if d:
                data[start:stop, offset:offset + d] = o.data
            offset += d
            for j in range(len(columns)):
                if j == e_slot:
                    extra = e.num_rows + (start - n_main) + np.arange(o.num_blocks)
                elif j in slots:
                    extra = o.columns[slots.index(j)]
                else:           # filled in by merge_groups: the row of a key holding the others'
                    extra = np.full(o.num_blocks, -1, np.int64)
                columns[j] = np.concatenate([columns[j], extra])
            start = stop
        self.columns, self.data, self.loss, self.name = columns, data, main.loss, main.name
        self.fn = _union_function(main.fn, main_data, [
            (o.fn, tuple(slots), d, o.num_residuals) for (o, slots), d in zip(others, widths)])
        self.num_blocks = n_main + n_extra
        self.main_blocks = n_main


def _same_loss(a, b) -> bool:
    return a.name == b.name and (a.name == "trivial" or a.scale == b.scale)


def _with_others(problem, block, e_slot):
    """The main kind ``block`` and every other kind as a :class:`_UnionBlock`, or None where one
    uses the eliminated group, a group the main kind does not, a group twice, or another loss;
    ``block`` itself when it is the only kind."""
    others = [r for r in problem.residuals if r is not block]
    if not others:
        return block
    names = [g.name for g in block.groups]
    taken = []
    for o in others:
        on = [g.name for g in o.groups]
        if names[e_slot] in on or len(set(on)) != len(on) or any(n not in names for n in on) \
                or not _same_loss(o.loss, block.loss):
            return None
        taken.append((o, [names.index(n) for n in on]))
    # Each kind's residuals per block, traced on the host (no device needed to count them), as
    # the general core's evaluator would record them for the report.
    from .problem_evaluator import residual_function
    for r in [block] + [o for o, _ in taken]:
        r.num_residuals = residual_function(r, problem.dtype, "numpy", None).n_outputs
    union = _UnionBlock(block, e_slot, taken)
    return union if _fill_keys(union, e_slot, taken) else None


def _fill_keys(union, e_slot, taken) -> bool:
    """Each block of the other kinds takes the rows of a main block that agrees with it on the
    kind's slots (its key then holds the rows it reads); False where none does."""
    main = union.main_blocks
    cols = union.columns
    start = main
    for o, slots in taken:
        stop = start + o.num_blocks
        sizes = [union.groups[j].num_rows for j in slots]
        if int(np.prod([max(1, n) for n in sizes], dtype=object)) >= 2 ** 62:
            return False
        code_main = np.zeros(main, np.int64)
        code_other = np.zeros(o.num_blocks, np.int64)
        for j, n in zip(slots, sizes):
            code_main = code_main * n + cols[j][:main]
            code_other = code_other * n + cols[j][start:stop]
        known, first = np.unique(code_main, return_index=True)
        at = np.minimum(np.searchsorted(known, code_other), max(known.size - 1, 0))
        if known.size == 0 or not np.array_equal(known[at], code_other):
            return False
        source = first[at]
        for j in range(len(cols)):
            if j != e_slot and j not in slots:
                cols[j][start:stop] = cols[j][source]
        start = stop
    return True


def merge_groups(problem, eliminated: Optional[str], shared: bool = False) -> Optional[MergedGroups]:
    """The merge of ``problem`` when it has the structure of the module docstring, else None;
    ``shared``: rows that several merged rows hold are taken (as copies)."""
    if eliminated is None:
        return None
    with_e = [r for r in problem.residuals if eliminated in [g.name for g in r.groups]]
    if len(with_e) != 1:
        return None
    block = with_e[0]
    names = [g.name for g in block.groups]
    if len(set(names)) != len(names) or eliminated not in names or len(names) < 2:
        return None
    e_slot = names.index(eliminated)
    block = _with_others(problem, block, e_slot)
    if block is None:
        return None
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
