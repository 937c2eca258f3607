"""Launcher of ``dense_cholesky_device.cl.mako``: a dense Cholesky factorisation and solve of one
symmetric positive definite matrix held on the OpenCL device, in float64 or float32 (the latter
the factor of :mod:`solvers.linalg.mixed_cholesky_device`'s mixed-precision solves).

:class:`DenseCholesky` owns the padded matrix ``A`` (``np x np``, row-major, ``np`` the size
rounded up to the block size), the right-hand side ``b`` and a failure flag. A caller writes the
lower triangle of its matrix into ``A`` and its right-hand side into ``b`` after :meth:`clear`,
then :meth:`factor` and :meth:`solve` enqueue everything with no host read; :meth:`failed` reads
the flag once at the end. :meth:`solve_host` does all of it for host arrays (the tests).
"""
from __future__ import annotations

import numpy as np
import pyopencl as cl

from clkernels import arrays
from clkernels.launch import presets, release_kernels
from clkernels.templates import get_program, template_request

TEMPLATE = "solvers/linalg/dense_cholesky_device.cl.mako"
NOT_POSITIVE_DEFINITE = 2        # the flag bit the template sets
# Block columns over which the trailing update is deferred (DenseCholesky.factor).
DEFER = 4
# Up to this padded size both triangular solves run in one launch of one work-group
# (solve_small) on CPUs: L is then at most 64 MiB, which one group reads faster than the launches
# of the per-block solves cost (each some microseconds on the host and on the device). GPUs take
# the per-block solves at every size: on the H200 they were faster from 2,000 unknowns (0.53 ms
# against 1.35 ms) and at 4,096 (1.6 against 5.9 ms), measured when they still solved four
# blocks a launch by substitution (the super-blocks below are faster still).
SMALL_SOLVE_MAX = 4096
# Blocks of the larger solves' super-blocks (the template's SS = SUPER_BLOCKS NB rows): each solve
# takes two launches per super-block, through its inverse, which the factorisation leaves. The
# launches' host cost bounds the solves on GPUs. H100, 16,002 unknowns, float32 (64-row blocks): a
# solve pair took 4.71 ms in 126 launches with four blocks solved by substitution a launch; through
# inverses 4.15 ms at 512 rows, 2.73 ms at 1,024 and 2.06 ms at 2,048, whose inverses took
# 0.40, 1.56 and 6.35 ms of the 80 ms factorisation. The mixed solve's refinement takes some six
# pairs per factorisation, so 1,024 rows (16 blocks) paid most there; a float64 factorisation
# (32-row blocks: 512) is solved about once, and its inverses must cost little.
SUPER_BLOCKS = 16
# The panel's work-items per row on GPUs (the template's PW): each step's updates spread over a
# row's items. H200, 16,002 unknowns: the panels took 12.6 ms at 8 against 22.3 ms at 1 (one
# item per row). CPUs keep 1: PoCL runs a group's items as loops, and 8 took 3.5x as long.
PANEL_WIDTH = 8


def device_small_solve_max(info) -> int:
    """The size up to which this device solves in one work-group (see :data:`SMALL_SOLVE_MAX`)."""
    return SMALL_SOLVE_MAX if info.is_cpu else 0


def device_panel_width(info, NB: int) -> int:
    """The panel's work-items per row on this device (see :data:`PANEL_WIDTH`)."""
    return 1 if info.is_cpu else max(1, min(PANEL_WIDTH, info.max_work_group_size // NB))


def super_rows_for(NB: int) -> int:
    """The default rows of a super-block for ``NB``-row blocks (see :data:`SUPER_BLOCKS`)."""
    return SUPER_BLOCKS * NB


def local_bytes(NB: int, itemsize: int = 8, SS: int = None) -> int:
    """The local memory of the template's largest work-group (the panel, the update and the
    super-blocks' inverses: two NB x NB tiles; the solves: one, and a super-block's vector), for
    a block size's fit on a device (``SS``: the super-block's rows, default :func:`super_rows_for`)."""
    SS = super_rows_for(NB) if SS is None else SS
    return max(2 * NB * (NB + 1), NB * (NB + 1) + SS) * itemsize


def block_sizes(info):
    """``(NB, RT)``: the block size and the update's entries per work-item and dimension.

    32 x 32 blocks (two 8.4 KiB local tiles per group, within every vendor's local memory; halved
    where a device has less). GPUs: 4 x 4 entries per update item (64 items a group, 16
    accumulators each; not measured here). CPUs, where PoCL runs a group's items as one loop:
    8 x 8 (16 items a group), the fastest of 2, 4 and 8 on PoCL (657 unknowns: 29-35 ms, against
    32-41 ms and 47-54 ms).
    """
    nb = 32
    while nb > 4 and local_bytes(nb) > info.local_mem_bytes:
        nb //= 2
    nb = min(nb, 1 << (info.max_work_group_size.bit_length() - 1))
    rt = 8 if info.is_cpu else 4
    rt = min(rt, nb)
    while (nb // rt) ** 2 > info.max_work_group_size:
        rt *= 2
    return nb, rt


def padded_size(n: int, nb: int) -> int:
    return arrays.round_up(max(1, int(n)), nb)


def super_count(m: int, SS: int) -> int:
    """The solves' super-blocks of a padded size ``m``."""
    return -(-int(m) // SS)


def dense_bytes(n: int, nb: int = 32, itemsize: int = 8, small_solve_max: int = 0, SS: int = None) -> int:
    """Device bytes of a :class:`DenseCholesky` for ``n`` unknowns (``itemsize``: 4 for float32),
    with its super-blocks' inverses (``SS`` rows each, default :func:`super_rows_for`) where its
    padded size exceeds ``small_solve_max`` (see :func:`device_small_solve_max`; 0, the default,
    counts them always)."""
    m = padded_size(n, nb)
    SS = super_rows_for(nb) if SS is None else SS
    inverses = super_count(m, SS) * SS * SS if m > small_solve_max else 0
    return itemsize * (m * m + 2 * m + 2 * m * nb + inverses) + 4


def solve_group(info, NB: int) -> int:
    """solve_small's work-group size: up to 256 items, a multiple of the block size."""
    return max(NB, min(256, info.max_work_group_size) // NB * NB)


class DenseCholesky:
    """The buffers and kernels of one ``n x n`` dense Cholesky on the device (see the module)."""

    def __init__(self, runtime, n: int, block: tuple = None, defer: int = DEFER,
                 small_solve_max: int = None, dtype=np.float64, super_rows: int = None,
                 panel_width: int = None):
        """``dtype``: np.float64 (needs the device's fp64) or np.float32, the matrix's storage
        and arithmetic. ``super_rows``: rows of a super-block of the solves above
        ``small_solve_max`` (None: :func:`device_small_solve_max`'s), a multiple of the block
        size (None: :func:`super_rows_for`'s). ``panel_width``: the panel's
        work-items per row (at most the device's work-group size over the block size; None:
        :func:`device_panel_width`'s)."""
        self.rt = rt = runtime
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise ValueError(f"dtype must be np.float64 or np.float32, not {dtype!r}")
        if self.dtype == np.float64 and not rt.info.fp64:
            raise ValueError(f"the float64 dense Cholesky needs fp64; {rt.info.name!r} has none")
        self.n = int(n)
        self.NB, self.RT = block or block_sizes(rt.info)
        self.m = padded_size(self.n, self.NB)
        if self.m * self.m >= 2 ** 31:
            raise ValueError(f"a {self.n} x {self.n} dense matrix is too large to index with 32-bit ints")
        self.nblocks = self.m // self.NB
        if int(defer) < 1:
            raise ValueError(f"defer must be a positive number of block columns, not {defer!r}")
        self.defer = int(defer)
        if super_rows is None:
            super_rows = super_rows_for(self.NB)
        if int(super_rows) < self.NB or int(super_rows) % self.NB:
            raise ValueError(f"super_rows must be a positive multiple of the block size {self.NB}, not {super_rows!r}")
        self.SS = int(super_rows)
        local = local_bytes(self.NB, self.dtype.itemsize, self.SS)
        if local > rt.info.local_mem_bytes:
            raise ValueError(f"super_rows={super_rows} needs {local} bytes of local memory with {self.NB} x "
                             f"{self.NB} blocks; {rt.info.name!r} has {rt.info.local_mem_bytes}: take fewer")
        if panel_width is None:
            panel_width = device_panel_width(rt.info, self.NB)
        if int(panel_width) < 1:
            raise ValueError(f"panel_width must be a positive number of work-items, not {panel_width!r}")
        self.PW = min(int(panel_width), max(1, rt.info.max_work_group_size // self.NB))
        if small_solve_max is None:
            small_solve_max = device_small_solve_max(rt.info)
        self.small_solve = self.m <= small_solve_max     # both solves in one launch (solve_small)
        real = lambda size: arrays.scratch(rt, size, self.dtype)  # noqa: E731
        self.A = real(self.m * self.m)
        self.b, self.z = real(self.m), real(self.m)
        self.diag, self.dinv = real(self.m * self.NB), real(self.m * self.NB)
        self.n_super = super_count(self.m, self.SS)
        # The super-blocks' inverses (the template's super_inverse), for the per-block solves only.
        self.sinv = None if self.small_solve else real(self.n_super * self.SS * self.SS)
        self.flag = arrays.scratch(rt, 1, np.int32)
        self.LS = solve_group(rt.info, self.NB)
        prg = get_program(TEMPLATE, rt, **self._params(rt, self.NB, self.RT, self.dtype, self.SS, self.PW))
        self.k = presets(prg, self)      # this instance's own kernels, arguments set when they change
        self._m = np.int32(self.m)
        self.events = None        # a list to keep (name, event) pairs for a profile, or None

    @staticmethod
    def _params(runtime, NB, RT, dtype, SS=None, PW=None):
        PW = device_panel_width(runtime.info, NB) if PW is None else PW
        SS = super_rows_for(NB) if SS is None else SS
        return dict(NB=NB, RT=RT, LS=solve_group(runtime.info, NB), SS=SS, PW=PW,
                    REAL="double" if np.dtype(dtype) == np.float64 else "float")

    @staticmethod
    def program_request(runtime, block: tuple = None, dtype=np.float64):
        """The program an instance on ``runtime`` builds, for :func:`clkernels.templates.prefetch`."""
        NB, RT = block or block_sizes(runtime.info)
        return template_request(TEMPLATE, **DenseCholesky._params(runtime, NB, RT, dtype))

    @property
    def nbytes(self) -> int:
        return (self.A.nbytes + self.b.nbytes + self.z.nbytes + self.diag.nbytes + self.dinv.nbytes
                + (self.sinv.nbytes if self.sinv is not None else 0) + self.flag.nbytes)

    def release(self):
        """Its kernel objects back to their pools now (:func:`clkernels.launch.release_kernels`);
        it launches nothing afterwards."""
        release_kernels(self)

    def _launch(self, name, gsize, lsize, *args):
        e = self.k[name](self.rt.queue, gsize, lsize, *args)
        if self.events is not None:
            self.events.append((name, e))

    def clear(self):
        """Enqueue ``A = diag(0, 1)`` (the padding's identity), ``b``'s padding zero, flag 0."""
        m = self.m
        self._launch("clear", (m, m), (self.NB, 1), self.A.data, self.b.data, self.flag.data,
                     np.int32(self.n), self._m)

    def factor(self):
        """Enqueue ``A = L L^T`` (L in A's strictly lower blocks and in ``diag``).

        Right-looking with the trailing update deferred over ``self.defer`` block columns: each
        panel updates only the rest of its deferred block's columns, and one update then
        subtracts all of the block's panels from the trailing matrix (one read and write of it
        per ``defer`` panels: the same launches, a quarter of the traffic at 4)."""
        NB, TT, nb, i32 = self.NB, self.NB // self.RT, self.nblocks, np.int32
        for ko in range(0, nb, self.defer):
            kend = min(ko + self.defer, nb)
            for kb in range(ko, kend):
                self._launch("panel", ((nb - kb) * NB, self.PW), (NB, self.PW), self.A.data, self._m,
                             i32(kb * NB), self.diag.data, self.dinv.data, self.flag.data)
                ncols = kend - kb - 1            # the deferred block's columns right of kb
                if ncols:
                    groups = ncols * (nb - kb - 1)
                    self._launch("update", (groups * TT, TT), (TT, TT), self.A.data, self._m, i32(kb * NB),
                                 i32(1), i32(kb + 1), i32(ncols))
            below = nb - kend
            if below:
                tiles = below * (below + 1) // 2
                self._launch("update", (tiles * TT, TT), (TT, TT), self.A.data, self._m, i32(ko * NB),
                             i32(kend - ko), i32(kend), i32(0))
        if self.sinv is not None:
            # The super-blocks' inverses for the solves, a block row of all of them a launch.
            for s in range(min(self.SS // NB, nb)):
                self._launch("super_inverse", ((s + 1) * TT, self.n_super * TT), (TT, TT), self.A.data, self._m,
                             self.dinv.data, self.sinv.data, i32(s))

    def solve(self, x):
        """Enqueue ``x = A^-1 b`` from the factor: ``x`` a device array of the matrix's type with at
        least ``n`` entries (its first ``n`` are written); ``b`` is overwritten."""
        NB, nbk = self.NB, self.nblocks
        if x.dtype != self.dtype or x.size < self.n:
            raise ValueError(f"x must be {self.dtype} with at least {self.n} entries, got {x.size} {x.dtype}")
        if self.small_solve:
            self._launch("solve_small", (self.LS,), (self.LS,), self.A.data, self._m, self.dinv.data,
                         self.b.data, self.z.data, x.data, np.int32(self.n))
            return
        i32, sbs = np.int32, self.SS // NB
        for j in range(self.n_super):                # the super-block, then a group per block below it
            kb = j * sbs
            nsub = min(sbs, nbk - kb)
            self._launch("forward_super", (nsub * NB,), (NB,), self.sinv.data, i32(j), i32(kb * NB), i32(nsub),
                         self.b.data, self.z.data, self._m)
            if nbk - kb - nsub:
                self._launch("forward_update", ((nbk - kb - nsub) * NB,), (NB,), self.A.data, self._m,
                             i32(kb * NB), i32(nsub), self.z.data, self.b.data)
        for j in reversed(range(self.n_super)):      # the super-block, then a group per block left of it
            kb = j * sbs
            nsub = min(sbs, nbk - kb)
            self._launch("backward_super", (nsub * NB,), (NB,), self.sinv.data, i32(j), i32(kb * NB), i32(nsub),
                         self.z.data, x.data, i32(self.n))
            if kb:
                self._launch("backward_update", (kb * NB,), (NB,), self.A.data, self._m, i32(kb * NB), i32(nsub),
                             x.data, self.z.data, i32(self.n))

    def failed(self) -> bool:
        """Whether the factorisation met a pivot that is not positive and finite (one read)."""
        flag = np.empty(1, np.int32)
        cl.enqueue_copy(self.rt.queue, flag, self.flag.data)
        return bool(flag[0] & NOT_POSITIVE_DEFINITE)

    # -- host arrays (tests, and anyone with a matrix on the host) ---------------------------
    def write_host(self, S, rhs):
        """Upload the symmetric ``S`` (n x n, its lower triangle is used) and ``rhs`` (n) padded."""
        m, n = self.m, self.n
        A = np.zeros((m, m), self.dtype)
        A[:n, :n] = np.tril(np.asarray(S, dtype=np.float64))
        A[np.arange(n, m), np.arange(n, m)] = 1.0
        b = np.zeros(m, self.dtype)
        b[:n] = rhs
        q = self.rt.queue
        cl.enqueue_copy(q, self.A.data, A)
        cl.enqueue_copy(q, self.b.data, b)
        cl.enqueue_copy(q, self.flag.data, np.zeros(1, np.int32))

    def solve_host(self, S, rhs):
        """``(x, ok)`` for host ``S`` and ``rhs``, all on the device."""
        self.write_host(S, rhs)
        self.factor()
        x = arrays.scratch(self.rt, max(1, self.n), self.dtype)
        arrays.keep_on_simulator(self.rt, x)      # a per-call output (see keep_on_simulator)
        self.solve(x)
        ok = not self.failed()
        return x.get()[:self.n], ok

    def lower_factor(self) -> np.ndarray:
        """L (n x n) from the last :meth:`factor`: the strictly lower blocks of ``A`` and ``diag``."""
        m, NB = self.m, self.NB
        A = self.A.get().reshape(m, m)
        diag = self.diag.get().reshape(self.nblocks, NB, NB)
        L = np.tril(A)
        for kb in range(self.nblocks):
            s = slice(kb * NB, (kb + 1) * NB)
            L[s, s] = diag[kb]
        return L[:self.n, :self.n]
