"""A dense symmetric positive definite solve on the device in mixed precision: the float64
matrix factorised in float32, the solution refined in float64 against the float64 matrix until
it is as accurate as the float64 factorisation's, else solved by the float64 factorisation after
all.

Why: on a GPU the dense Cholesky's trailing update is the reduced camera system's cost (0.11 s
of 0.16 s at 16,002 unknowns on an H200, float64), and float32 arithmetic runs at twice
float64's rate there; each refinement step is one matrix read and two float32 triangular solves.

:class:`MixedCholesky` has :class:`~solvers.linalg.dense_cholesky_device.DenseCholesky`'s
interface for a caller that assembles its matrix on the device: ``A``, ``b``, ``m``, ``flag``
(the float64 matrix's), :meth:`clear`, :meth:`factor`, :meth:`solve`. Only :meth:`solve` waits
for the device (it reads the residual after each step, and decides).

The refinement (LAPACK's dsyrfs test on dsposv's scheme): ``x = 0``, ``r = b``; per step
``x += A32^-1 r``, ``r = b - S x`` in float64, and the componentwise backward error
``w = max_i |r_i| / (|S| |x| + |b|)_i``. Done when ``w <= eps`` (2^-53), or when a step no longer
halves ``w`` and ``w <= n eps`` (float64's rounding floor). A normwise test (dsposv's
``|r| <= |x| |S| eps sqrt(n)``) stopped too early on badly scaled matrices: residuals 40-700x the
float64 factorisation's at conditions of 5e8-3e9. The float64 factorisation takes over when the
float32 one meets a pivot that is not positive, when ``w`` stalls above ``n eps`` (the float32
factor is too poor a preconditioner for this matrix: further steps would be wasted), or after
:data:`MAX_STEPS` steps. Once it has, it factorises in float64 from the next solve on as well:
in a Levenberg-Marquardt solve the damping mostly falls from one iteration to the next and the
matrix's condition grows, so the float32 factorisation would mostly be wasted again (on
problem-49 of the BAL set the last seven solves all handed over).
"""
from __future__ import annotations

import numpy as np
import pyopencl as cl

from clkernels import arrays
from clkernels.launch import presets, release_kernels
from clkernels.templates import get_program, template_request

from . import factorisation_limits as limits
from .dense_cholesky_device import (NOT_POSITIVE_DEFINITE, DenseCholesky, block_sizes, dense_bytes,
                                    device_small_solve_max, local_bytes)

TEMPLATE = "solvers/linalg/mixed_refinement.cl.mako"
MAX_STEPS = 30                     # dsposv's ITERMAX
EPS = 2.0 ** -53                   # float64's unit roundoff (LAPACK's dlamch('Epsilon'))
TILE = 32                          # the demote kernel's tile (the template's TS)


def residual_group(info) -> int:
    return 1 << (min(256, info.max_work_group_size).bit_length() - 1)


def mixed_bytes(n: int, nb: int = 32, nb32: int = None, small_solve_max: int = 0) -> int:
    """Device bytes of a :class:`MixedCholesky` for ``n`` unknowns: both matrices (the float64 one
    padded to ``nb``, the float32 one to ``nb32``, default ``nb``, each with its solves'
    super-block inverses as :func:`dense_bytes` counts them) and the vectors."""
    nb32 = nb if nb32 is None else nb32
    m = -(-max(1, int(n)) // nb) * nb
    return (dense_bytes(n, nb, small_solve_max=small_solve_max)
            + dense_bytes(n, nb32, 4, small_solve_max=small_solve_max) + 8 * 2 * m + 4 * m)


def float32_blocks(info, block64: tuple) -> tuple:
    """The float32 factorisation's (NB, RT) on GPUs: 64 x 64 blocks with 8 x 8 entries per update
    item where the local memory holds them (H200, 16,002 unknowns: the float32 update 61 ms
    against 94 ms with the float64 factorisation's 32 x 32 blocks and 4 x 4, 115 ms in float64);
    elsewhere the float64 one's."""
    nb, rt = 64, 8
    fits = local_bytes(nb, 4) <= info.local_mem_bytes \
        and (nb // rt) ** 2 <= info.max_work_group_size
    return (nb, rt) if fits and not info.is_cpu else tuple(block64)


# From this many unknowns the mixed solve is the default on GPUs. H200, factorisation and solve
# (bench_dense_cholesky): 16,002 unknowns 0.109 s against 0.136 s in float64, 8,192 0.029 against
# 0.031 s, 4,096 slower (0.028 against 0.011 s: there the refinement's steps outweigh the
# float32 update's saving).
MIXED_MIN_UNKNOWNS = 8192


def choose_mixed(info, n_unknowns: int, other_bytes: int, mixed=None) -> bool:
    """Whether a matrix that is factorised on the device is solved in mixed precision
    (``Options.mixed_precision_solves``): ``mixed`` True or False as asked; None: on GPUs and
    other accelerators (on CPU devices float32 has no such edge, and the host factorises
    anyway) from :data:`MIXED_MIN_UNKNOWNS` unknowns, where the float32 copy fits beside the
    float64 matrix."""
    if mixed is False or (mixed is None and (info.is_cpu or n_unknowns < MIXED_MIN_UNKNOWNS)):
        return False
    block = block_sizes(info)
    need = mixed_bytes(n_unknowns, block[0], float32_blocks(info, block)[0], device_small_solve_max(info))
    return bool(mixed) or need <= limits.DENSE_MEMORY_FRACTION * max(0, info.global_mem_bytes - other_bytes)


class MixedCholesky:
    """See the module docstring. ``block``: the float64 factorisation's (NB, RT), ``block32``
    the float32 one's (default :func:`float32_blocks`); ``defer`` and ``small_solve_max`` as
    :class:`~solvers.linalg.dense_cholesky_device.DenseCholesky` takes them, for both."""

    def __init__(self, runtime, n: int, block: tuple = None, block32: tuple = None, defer: int = None,
                 max_steps: int = MAX_STEPS, small_solve_max: int = None):
        self.rt = rt = runtime
        kw = {} if defer is None else dict(defer=defer)
        kw["small_solve_max"] = small_solve_max
        self.d64 = DenseCholesky(rt, n, block=block, **kw)
        block32 = block32 or float32_blocks(rt.info, (self.d64.NB, self.d64.RT))
        self.d32 = DenseCholesky(rt, n, block=block32, dtype=np.float32, **kw)
        self.n, self.m = self.d64.n, self.d64.m
        self.A, self.b, self.flag = self.d64.A, self.d64.b, self.d64.flag
        self.max_steps = int(max_steps)
        m = self.m
        self.r = arrays.zeros(rt, m, np.float64)           # its padding stays zero
        self.scale = arrays.scratch(rt, m, np.float64)
        self.c = arrays.scratch(rt, max(1, self.n), np.float32)
        self.LS = residual_group(rt.info)
        self.k = presets(get_program(TEMPLATE, rt, LS=self.LS), self)
        self._m, self._m32, self._n = np.int32(m), np.int32(self.d32.m), np.int32(self.n)
        self.events = None
        self.steps = 0                 # refinement steps of the last solve
        self.fell_back = False         # whether the last solve took the float64 factorisation
        self.fallbacks = 0             # over this instance's life
        self.float64_only = False      # after a hand-over (module docstring)
        self.bytes_to_host = 0         # the residuals and flags read (the caller's transfers count them)

    @staticmethod
    def program_requests(runtime, block: tuple = None):
        NB, RT = block or block_sizes(runtime.info)
        return [DenseCholesky.program_request(runtime, (NB, RT)),
                DenseCholesky.program_request(runtime, float32_blocks(runtime.info, (NB, RT)), dtype=np.float32),
                template_request(TEMPLATE, LS=residual_group(runtime.info))]

    @property
    def nbytes(self) -> int:
        return self.d64.nbytes + self.d32.nbytes + self.r.nbytes + self.scale.nbytes + self.c.nbytes

    def release(self):
        """Its kernel objects and both factorisations' back to their pools now."""
        release_kernels(self)
        self.d64.release()
        self.d32.release()

    def _launch(self, name, gsize, lsize, *args):
        e = self.k[name](self.rt.queue, gsize, lsize, *args)
        if self.events is not None:
            self.events.append((name, e))

    def _share_events(self):
        self.d64.events = self.d32.events = self.events

    def clear(self):
        """Enqueue S = the padded identity, b's padding zero, the flag 0 (DenseCholesky.clear)."""
        self._share_events()
        self.d64.clear()

    def factor(self):
        """Enqueue the float32 copy of S's lower triangle (S's upper triangle made its mirror)
        and its factorisation."""
        self._share_events()
        if self.float64_only:
            return
        t = -(-max(self.m, self.d32.m) // TILE)
        self._launch("demote", (t * TILE, t * 8), (TILE, 8), self.A.data, self.d32.A.data, self.d32.flag.data,
                     self._m, self._m32)
        self.d32.factor()

    def write_host(self, S, rhs):
        """Upload the symmetric ``S`` (its lower triangle is used) and ``rhs`` (DenseCholesky.write_host)."""
        self.d64.write_host(S, rhs)

    def failed(self) -> bool:
        """Whether the last solve met a matrix that is not positive definite (one read)."""
        return bool(self._read(self.flag)[0] & NOT_POSITIVE_DEFINITE)

    def _read(self, a, count=None):
        out = np.empty(a.size if count is None else count, a.dtype)
        cl.enqueue_copy(self.rt.queue, out, a.data)
        self.bytes_to_host += out.nbytes
        return out

    def solve(self, x):
        """``x`` (a float64 device array of at least ``n`` entries) = S^-1 b; waits for the device.
        Sets :attr:`steps` and :attr:`fell_back`; a failure of both factorisations is in ``flag``
        as :meth:`DenseCholesky.factor` leaves it."""
        if x.dtype != np.float64 or x.size < self.n:
            raise ValueError(f"x must be float64 with at least {self.n} entries, got {x.size} {x.dtype}")
        self.steps, self.fell_back = 0, False
        if self.float64_only:
            self.d64.factor()
            self.d64.solve(x)
            return
        flags = self._read(self.d32.flag)[0] | self._read(self.flag)[0]
        if flags & ~NOT_POSITIVE_DEFINITE:
            return                      # S itself is not finite: the caller reads that in flag
        if not flags & NOT_POSITIVE_DEFINITE and self._refine(x):
            return
        self.fell_back = self.float64_only = True
        self.fallbacks += 1
        self.d64.factor()
        self.d64.solve(x)

    def _refine(self, x) -> bool:
        n = self.n
        r_host = self._read(self.b)[:n]
        r_dev = self.b
        previous = None                 # the backward error before the step
        for step in range(self.max_steps):
            rmax = float(np.max(np.abs(r_host))) if n else 0.0
            if not np.isfinite(rmax):
                return False
            if step == 0 and rmax == 0.0:
                self._launch("accumulate", (arrays.round_up(max(1, n), 64),), None, x.data, self.c.data,
                             np.float64(0.0), self._n, np.int32(2))
                return True
            s = 1.0 / rmax
            self._launch("scale_down", (arrays.round_up(self.d32.m, 64),), None, r_dev.data, self.d32.b.data,
                         np.float64(s), self._m, self._m32)
            self.d32.solve(self.c)
            self._launch("accumulate", (arrays.round_up(max(1, n), 64),), None, x.data, self.c.data,
                         np.float64(rmax), self._n, np.int32(0 if step == 0 else 1))
            self._launch("residual", (n * self.LS,), (self.LS,), self.A.data, self.b.data, x.data,
                         self.r.data, self.scale.data, self._m, self._n)
            r_dev = self.r
            self.steps = step + 1
            r_host = self._read(self.r, n)
            scale = self._read(self.scale, n)
            with np.errstate(divide="ignore", invalid="ignore"):
                w = np.abs(r_host) / scale
            w = float(np.max(np.where(r_host == 0.0, 0.0, w)))     # 0/0: an exact row
            if not np.isfinite(w):
                return False
            if w <= EPS:
                return True
            if previous is not None and w > 0.5 * previous:
                return w <= n * EPS
            previous = w
        return False
