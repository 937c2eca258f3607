"""sparse_schur's reduced camera system ``S yc = rhs`` assembled on the OpenCL device
(``schur_reduced_device.cl.mako``), in the conventions of :mod:`solvers.ba.schur`:

    rhs = gc - W V^-1 gp,     S = B + Dc^2 - W V^-1 W^T,

with ``W = F^T E``. :class:`ReducedPattern` is S's block-sparse structure (which camera pairs share
a point, and through which observations), found on the host once per solve from the observations'
cameras and points; :class:`ReducedCameraSystem` holds it on the device and enqueues the
assembly, either as S's nonzero blocks (for a host factorisation) or into a dense matrix (for
:class:`solvers.linalg.dense_cholesky_device.DenseCholesky`).
"""
from __future__ import annotations

import numpy as np
import pyopencl.array as cla

from clkernels import arrays
from clkernels.launch import Preset, owned_kernel
from clkernels.templates import get_program, template_request

from ..ba import ordering

TEMPLATE = "solvers/linalg/schur_reduced_device.cl.mako"
# Pairs one work-item of pair_partials sums: a camera's diagonal block has a pair per point it
# sees (thousands), an off-diagonal block a pair per shared point. Short on GPUs, which need many
# work-items; long on CPUs, where they run one after another anyway.
MAX_RUN_CPU = 4096
MAX_RUN_GPU = 64
# Groups one work-item of rhs_partials sums (a camera has a group per point it sees).
MAX_RHS_RUN = 64


class ReducedPattern:
    """S's nonzero C x C blocks (a <= b: every camera's diagonal block, and the pairs of cameras
    that see a common point) and, per block, the pairs of camera-point groups that sum into it.

    A camera-point group is one camera's observations of one point (one, unless a camera sees a
    point twice); groups are numbered in camera order, points in order within a camera.
    Observations must be sorted by point (solvers.ba.schur.Structure's order)."""

    def __init__(self, cam, pt, num_cameras, num_points, max_run=MAX_RUN_CPU, camera_order=None):
        cam, pt = np.asarray(cam), np.asarray(pt)
        n, nc, npt = cam.size, int(num_cameras), int(num_points)
        if n and (cam.min() < 0 or cam.max() >= nc or pt.min() < 0 or pt.max() >= npt):
            raise ValueError("an observation's camera or point index is out of range")
        if n and not ordering.is_sorted(pt):
            raise ValueError("observations must be sorted by point index")
        # Observations in camera order, points in order within a camera (the Evaluator's
        # camera_order when given: the same order, already made), cut into groups.
        obs = camera_order if camera_order is not None else ordering.stable_order(cam, nc)
        c, p = ordering.take(cam, obs), ordering.take(pt, obs)
        new_group = ordering.changes(c, np.arange(n)) | ordering.changes(p, np.arange(n)) if n \
            else np.zeros(0, bool)
        first = np.flatnonzero(new_group)
        self.group_cam = group_cam = c[first]
        group_pt = p[first]
        del c, p, new_group
        cam_group = ordering.starts(group_cam, nc)
        pair_a, pair_b, present, present_start = _pairs_by_block(group_cam, group_pt, cam_group, nc, npt)
        self._finish(n, nc, npt, max_run, obs, np.concatenate((first, [n])), group_pt, cam_group,
                     pair_a, pair_b, present, present_start)

    @classmethod
    def from_pairs(cls, n, nc, npt, max_run, obs, group_start, group_pt, cam_group, pair_a, pair_b,
                   present, present_start) -> "ReducedPattern":
        """The pattern of groups and pairs made elsewhere (on the device:
        :mod:`solvers.linalg.schur_pattern_device`), equal to what ``__init__`` makes of the
        observations: ``obs``, ``group_start`` (ngroups + 1), ``group_pt``, ``pair_a``, ``pair_b``
        (host or device arrays, as the system takes them), and on the host ``cam_group`` (nc + 1),
        the blocks that have pairs (``present``, as ``a * nc + b``, ascending) and where each
        one's pairs begin (``present_start``). ``group_cam`` is not kept (None)."""
        self = cls.__new__(cls)
        self.group_cam = None
        self._finish(n, nc, npt, max_run, obs, group_start, group_pt, cam_group, pair_a, pair_b,
                     np.asarray(present, np.int64), np.asarray(present_start, np.int64))
        return self

    def _finish(self, n, nc, npt, max_run, obs, group_start, group_pt, cam_group, pair_a, pair_b,
                present, present_start):
        """The blocks and the runs, from the groups and the pairs sorted by block."""
        self.n, self.nc, self.npt, self.max_run = n, nc, npt, max_run
        self.obs, self.group_start, self.group_pt, self.cam_group = obs, group_start, group_pt, cam_group
        self.pair_a, self.pair_b = pair_a, pair_b
        # Blocks: every diagonal one (an unobserved camera's holds Dc^2 only) and the shared ones.
        # Both are sorted: a stable sort merges the two runs in one pass (np.union1d would sort
        # or hash them whole: 0.24 s at 1,000 images on the H200 machine's host).
        blocks = np.concatenate((present, np.arange(nc, dtype=np.int64) * (nc + 1)))
        blocks.sort(kind="stable")
        if blocks.size:
            blocks = blocks[np.concatenate(([True], blocks[1:] != blocks[:-1]))]
        self.block_row, self.block_col = blocks // nc, blocks % nc
        self.nblocks = blocks.size
        self.npairs = npairs = int(pair_a.size)
        # Each block's first pair (a block without pairs: where the next one's begin).
        pair_start = np.concatenate((present_start, [npairs]))[np.searchsorted(present, blocks)]
        # Runs of at most max_run pairs of one block (a block without pairs has none); the
        # blocks' pair ranges follow one another in the sorted pairs.
        runs = ordering.cut_runs(np.concatenate((pair_start, [npairs])), max_run)
        self.block_run, self.run_start, self.nruns = runs.item_run, runs.start, runs.owner.size
        # rhs: each camera's groups in runs of at most MAX_RHS_RUN.
        self.ngroups = int(group_start.size) - 1
        runs = ordering.cut_runs(cam_group, MAX_RHS_RUN)
        self.cam_rhs_run, self.rhs_run_start, self.nrhs_runs = runs.item_run, runs.start, runs.owner.size

    @property
    def fill(self) -> float:
        """The fraction of S's C x C blocks that are nonzero (both triangles)."""
        return (2 * self.nblocks - self.nc) / max(1, self.nc * self.nc)

    @property
    def offdiagonal(self) -> np.ndarray:
        return self.block_row != self.block_col

    def index_bytes(self) -> int:
        return 4 * (self.n + 2 * (self.group_start.size + self.nc) + 2 * self.npairs
                    + self.run_start.size + self.block_run.size + 2 * self.nblocks
                    + self.rhs_run_start.size + self.cam_rhs_run.size)


def _pairs_by_block(group_cam, group_pt, cam_group, nc: int, npt: int):
    """The pairs ``(a, b)`` of camera-point groups of one point with ``a``'s camera at most ``b``'s
    (each group with itself too), sorted by their block ``cam(a) * nc + cam(b)``, and within a
    block by point; returns ``(pair_a, pair_b, present, present_start)``: the pairs, the blocks
    that have pairs (ascending) and the index of each one's first pair.

    Groups are numbered in camera order, points ascending within a camera (``cam_group``: each
    camera's first group, nc + 1). So a pair made for each group ``a`` in that order, with the
    groups after it in its point's run (cameras ascending), comes out sorted by ``a``'s camera,
    then by point; sorting each camera's pairs stably by ``b``'s camera finishes the order. Those
    sorts are over a camera's pairs (thousands, radix sorts of 16-bit keys, on threads), where
    one sort of all the pairs by block, then gathers over all of them, read memory at random: the
    whole pattern at venice size (15.3M pairs) took 0.70 s on the 2-core CPU against 0.96 s that
    way (benchmarks/results/preprocessing-sparse-schur-pocl.md). ``first - where`` below may be
    negative (a group's first pair lies before its place in point order), hence signed indices."""
    ng = group_cam.size
    it_g = ordering.index_dtype(ng)
    # Each group's place in point order (cameras ascending within a point), and its partners:
    # itself and the groups after it in its point's run.
    by_pt = ordering.stable_order(group_pt, npt, it_g)
    where = ordering.inverse_permutation(by_pt, it_g)
    point_end = ordering.starts(group_pt, npt)              # (from counts: no gather by by_pt)
    partners = (ordering.take(point_end, group_pt + 1) - where).astype(it_g)
    del point_end
    pair_end = np.cumsum(partners, dtype=np.int64)
    npairs = int(pair_end[-1]) if ng else 0
    it = ordering.index_dtype(npairs)
    # Pair p of group g (its k-th) pairs it with by_pt[where[g] + k], k = p - first:
    # by_pt[p - (first - where[g])].
    at = np.repeat((pair_end - partners - where).astype(it), partners)
    np.subtract(np.arange(npairs, dtype=it), at, out=at)
    b = ordering.take(by_pt, at, it_g)
    del at, by_pt, where
    key = np.uint16 if nc <= 1 << 16 else np.int64          # b's camera: numpy radix-sorts 16 bits
    cam_b = ordering.take(group_cam, b, key)
    a = np.repeat(np.arange(ng, dtype=it_g), partners)
    first_pair = np.concatenate(([0], pair_end))[cam_group]    # each camera's first pair (nc + 1)
    cam_b, pair_a, pair_b = ordering.sort_within(first_pair, cam_b, a, b)
    del a, b
    # The blocks with pairs, in order, and each one's first pair: where b's camera changes
    # within a camera's pairs, or a camera's pairs begin.
    new_block = np.empty(npairs, bool)
    if npairs:
        new_block[0] = True
        np.not_equal(cam_b[1:], cam_b[:-1], out=new_block[1:])
        new_block[first_pair[:-1][np.diff(first_pair) > 0]] = True
    present_start = np.flatnonzero(new_block)
    cam_a = np.searchsorted(first_pair, present_start, side="right") - 1
    return pair_a, pair_b, cam_a * nc + cam_b[present_start], present_start


class ReducedCameraSystem:
    """The device copy of a :class:`ReducedPattern` and the kernels that assemble S and rhs.

    Every ``enqueue_*`` method takes device arrays (float64, contiguous) and returns at once:
    Jc (n, R, C) and Jp (n, R, P) sorted by point, ``Vinv`` (npt, P, P) = (V + Dp^2)^-1, B's upper
    triangles (nc, C (C + 1) / 2), ``dc2`` (nc * C), ``gc`` (nc * C), ``gp`` (npt * P). ``flag``
    (int32) gets bit 0 set when a value of S or rhs is not finite."""

    def __init__(self, runtime, pattern: ReducedPattern, C=9, P=3, R=2, whole_run=None):
        self.rt, self.pat = runtime, pattern
        self.C, self.P, self.R = C, P, R
        # pair_partials: on CPUs a work-item sums a run's whole C x C block, reading each pair's
        # G and Z once (PoCL runs the work-item per row as scalar loops that read G C times:
        # 3-5x slower); GPUs want the C times more work-items.
        self.whole_run = runtime.info.is_cpu if whole_run is None else bool(whole_run)
        if max(pattern.n, pattern.npairs, C * pattern.nc, pattern.nruns * C * C,
               2 * C * P * pattern.ngroups) >= 2 ** 31:
            raise ValueError("the reduced camera system indexes with 32-bit ints: problem too large")
        uploaded = []

        def i32(a):
            # Arrays the pattern made on the device (solvers.linalg.schur_pattern_device) stay there.
            if isinstance(a, cla.Array):
                if a.dtype != np.int32 or not a.flags.c_contiguous:
                    raise ValueError("a device pattern's index arrays must be contiguous int32, got "
                                     f"{a.dtype} (contiguous: {a.flags.c_contiguous})")
                return a if a.size else arrays.zeros(runtime, 1, np.int32)
            out = arrays.to_device(runtime, np.ascontiguousarray(a if len(a) else [0], dtype=np.int32))
            uploaded.append(out.nbytes)
            return out

        pat = pattern
        self.obs, self.group_start, self.group_pt = i32(pat.obs), i32(pat.group_start), i32(pat.group_pt)
        self.cam_group = i32(pat.cam_group)
        self.pair_a, self.pair_b, self.run_start = i32(pat.pair_a), i32(pat.pair_b), i32(pat.run_start)
        self.block_run, self.block_row, self.block_col = i32(pat.block_run), i32(pat.block_row), i32(pat.block_col)
        self.rhs_run_start, self.cam_rhs_run = i32(pat.rhs_run_start), i32(pat.cam_rhs_run)
        self.partial = arrays.scratch(runtime, max(1, pat.nruns * C * C), np.float64)
        self.rhs_partial = arrays.scratch(runtime, max(1, pat.nrhs_runs * C), np.float64)
        # G and Z = G V^-1 per camera-point group: made by enqueue_groups for rhs and blocks.
        self.GZ = arrays.scratch(runtime, max(1, pat.ngroups * 2 * C * P), np.float64)
        self.bytes_to_device = sum(uploaded)
        self._k = {}
        self.events = None        # a list to keep (name, event) pairs for a profile, or None
        ls = 8 if runtime.info.is_cpu else 64
        # Work-group sizes per kernel (keyed as the kernels are): the assembly's now, with its
        # program; reduced_blocks' at its first launch, since asking builds the program of that
        # output alone.
        self._ls_wanted = ls
        self._ls = {}
        for name in ("group_blocks", "rhs_partials", "reduced_rhs", "pair_partials"):
            self._work_group(name, None)

    @property
    def nbytes(self) -> int:
        return self.bytes_to_device + self.partial.nbytes + self.rhs_partial.nbytes + self.GZ.nbytes

    @staticmethod
    def estimate_bytes(pattern: "ReducedPattern", C=9, P=3) -> int:
        """Device bytes of a system for ``pattern``, before making it."""
        return pattern.index_bytes() + 8 * (pattern.nruns * C * C + pattern.nrhs_runs * C
                                            + pattern.ngroups * 2 * C * P)

    @staticmethod
    def program_request(runtime, C, P, R, out, whole_run=None):
        """The program of one output (``out``: None for the assembly's kernels, "blocks" or
        "dense" for reduced_blocks'), for :func:`clkernels.templates.prefetch`."""
        whole_run = runtime.info.is_cpu if whole_run is None else bool(whole_run)
        return template_request(TEMPLATE, C=C, P=P, R=R, OUT=out, WHOLE_RUN=whole_run)

    @staticmethod
    def _key(name, out):
        return name, (None if name != "reduced_blocks" else out)     # the template's OUT

    def _work_group(self, name, out) -> int:
        key = self._key(name, out)
        ls = self._ls.get(key)
        if ls is None:
            ls = self._ls[key] = arrays.work_group_size(self.rt, self._kernel(name, out).kernel, self._ls_wanted)
        return ls

    def _kernel(self, name, out):
        key = self._key(name, out)
        if key not in self._k:
            prg = get_program(TEMPLATE, self.rt, **self.program_request(self.rt, self.C, self.P, self.R, key[1],
                                                                        self.whole_run).params)
            self._k[key] = Preset(owned_kernel(prg, name, self))   # this instance's own, arguments set when they change
        return self._k[key]

    def _run(self, name, items, *args, out="blocks"):
        if items <= 0:
            return
        ls = self._work_group(name, out)
        if name in ("rhs_partials", "reduced_rhs") or (name == "pair_partials" and not self.whole_run):
            items *= self.C                 # a work-item per row
        e = self._kernel(name, out)(self.rt.queue, (arrays.round_up(items, ls),), (ls,), *args)
        if self.events is not None:
            self.events.append((name, e))

    def enqueue_groups(self, Jc, Jp, Vinv):
        """G and Z = G V^-1 per camera-point group, which enqueue_rhs and the blocks read: enqueue
        it first, after every change of the Jacobian or of V^-1."""
        self._run("group_blocks", self.pat.ngroups, Jc.data, Jp.data, Vinv.data, self.obs.data,
                  self.group_start.data, self.group_pt.data, self.GZ.data, np.int32(self.pat.ngroups))

    def enqueue_rhs(self, gc, gp, rhs, flag):
        """``rhs`` (at least nc * C entries) = gc - W V^-1 gp (after :meth:`enqueue_groups`)."""
        self._run("rhs_partials", self.pat.nrhs_runs, self.GZ.data, self.group_pt.data, gp.data,
                  self.rhs_run_start.data, self.rhs_partial.data, np.int32(self.pat.nrhs_runs))
        self._run("reduced_rhs", self.pat.nc, gc.data, self.rhs_partial.data, self.cam_rhs_run.data,
                  rhs.data, flag.data, np.int32(self.pat.nc))

    def _enqueue_partials(self):
        self._run("pair_partials", self.pat.nruns, self.GZ.data, self.pair_a.data, self.pair_b.data,
                  self.run_start.data, self.partial.data, np.int32(self.pat.nruns))

    def enqueue_blocks(self, B, dc2, out, flag):
        """``out`` (nblocks, C, C): S's nonzero blocks, in :class:`ReducedPattern`'s order (after
        :meth:`enqueue_groups`)."""
        self._enqueue_partials()
        self._run("reduced_blocks", self.pat.nblocks, B.data, dc2.data, self.partial.data, self.block_run.data,
                  self.block_row.data, self.block_col.data, out.data, flag.data, np.int32(self.pat.nblocks),
                  np.int32(0), out="blocks")

    def enqueue_dense(self, B, dc2, A, ld, flag):
        """S's nonzero blocks into the lower triangle of the row-major dense ``A`` (``ld``
        columns); the rest of ``A`` is left as it is (zero it first). After :meth:`enqueue_groups`."""
        self._enqueue_partials()
        self._run("reduced_blocks", self.pat.nblocks, B.data, dc2.data, self.partial.data, self.block_run.data,
                  self.block_row.data, self.block_col.data, A.data, flag.data, np.int32(self.pat.nblocks),
                  np.int32(ld), out="dense")
