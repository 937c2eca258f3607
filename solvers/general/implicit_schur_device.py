"""The general core's iterative_schur without the reduced matrix: ``S y`` applied on the OpenCL
device, the conjugate gradients on the host, as Ceres' ITERATIVE_SCHUR does it.

``S = F^T F + D_F^2 - W V^-1 W^T`` is never formed. Every observation of the kind has a key (the
tuple of its non-eliminated rows; for COLMAP the image, :func:`solvers.general.pair_schur.observation_keys`),
and with the keys as cameras of K columns the bundle adjuster's implicit product
(:class:`solvers.linalg.schur_pcg_device.DevicePCG`'s ``project_points`` and ``camera_partials``) gives the keys'
``F^T (I - E V^-1 E^T) F v``. A problem column shared by many keys (a camera's intrinsics) has a
copy per key: its entry of ``v`` is gathered into every copy and the copies' results are summed.
Per CG iteration the device reads the Jacobian blocks once and the host moves two vectors of the
keys' size; forming ``S`` instead costs a product per pair of observations of a point (3.4 s per
iteration at 2,000 images, against 14.6 s for pycolmap's whole solve).

The preconditioner is Ceres' SCHUR_JACOBI: the inverses of ``S``'s diagonal blocks, one per row
of every group over its free entries. A row that one key holds (a pose) takes its block from that
key's sums on the device (``key_normal`` less ``jacobi_sums``); a row shared by keys (shared
intrinsics) also has products between different keys' observations of one point, which the host
sums per point over the shared columns alone.
"""
from __future__ import annotations

import numpy as np
import pyopencl as cl

from clkernels import arrays
from clkernels.launch import owned_kernel, release_kernels
from clkernels.templates import get_program

from ..ba import ordering
from . import pair_schur_device
from .pair_schur import PairReduction, observation_keys, sum_copies, unique_inverse
from ..linalg.schur_pcg_device import DevicePCG


class NoImplicitSchur(ValueError):
    """The device product does not serve this problem (the message says why)."""


class DeviceImplicitSchur(PairReduction):
    """``S y`` (the kind's part, without ``D_F^2``), the reduced right-hand side and the
    back-substitution for one residual kind ``kind`` (a :class:`solvers.general.sparse_state._Kind` with
    an eliminated slot) on ``runtime``'s device, and the Schur-Jacobi blocks of ``S``.
    ``blocks`` is ``[(T, base)]`` per non-eliminated group with free entries: its active rows'
    tangent indices (rows, size), -1 at constant entries, and its first block's number; ``blk``
    and ``pos`` (nf) each problem column's block and its position in the row
    (:meth:`solvers.general.sparse_state.SparseState._block_of_column`)."""

    implicit = True
    covers_rows = True

    def __init__(self, kind, block, nf: int, ne_rows: int, runtime, blocks, blk, pos):
        self.rt = rt = runtime
        if not rt.info.fp64:
            raise NoImplicitSchur(f"{rt.info.name!r} has no fp64")
        self.obs, e, key, key_cols = observation_keys(kind, block, ne_rows)
        nk, K = key_cols.shape
        # The kind's observations already by eliminated row, all active (COLMAP's problems):
        # its blocks go to the device as they are.
        self.in_order = self.obs.size == kind.n and bool(np.all(self.obs == np.arange(kind.n)))
        self.nf, self.ne_rows, self.nk, self.K = nf, ne_rows, nk, K
        self.kE, self.R = kind.e_free.size, kind.R
        n, R, kE = self.obs.size, self.R, self.kE
        if max(n * R * max(K, kE), nk * K, kE * kE * ne_rows) >= 2 ** 31:
            raise NoImplicitSchur(f"{n} observations of {nk} keys: more than the device CG's 32-bit indices")
        # The Jacobian blocks, residuals and the CG's per-observation vectors, with room for the
        # rest: a problem that does not fit stays with the host (a device allocation that fails
        # would only show mid-solve).
        need = 8 * n * R * (K + kE + 4) + 8 * nk * K * (3 * K + 12) + 8 * ne_rows * kE * (2 * kE + 4)
        if need > 0.8 * rt.info.global_mem_bytes or 8 * n * R * K > rt.info.max_alloc_bytes:
            raise NoImplicitSchur(f"about {need / 2**30:.1f} GiB for the device products; "
                             f"{rt.info.name!r} has {rt.info.global_mem_bytes / 2**30:.1f} GiB")
        self.pcg = DevicePCG(rt, key.astype(np.int32), e.astype(np.int32), nk, ne_rows, C=K, P=self.kE, R=self.R)
        # Gather and scatter between problem columns and the keys' copies (constant: a zero pad).
        self.copy_of = key_cols.ravel()
        self.gather = np.where(self.copy_of >= 0, self.copy_of, nf)
        # The keys' blocks of F^T F (pair_schur_device's key_normal) over the observations in key
        # order (the CG's camera order).
        self.k_normal = owned_kernel(get_program(pair_schur_device.TEMPLATE, rt, K=K, R=self.R), "key_normal", self)
        self.key_start = arrays.to_device(rt, np.concatenate(
            ([0], np.cumsum(np.bincount(key, minlength=nk)))).astype(np.int32))
        self.normal = arrays.scratch(rt, max(1, nk * K * (K + 1) // 2), np.float64)
        self.ls = arrays.work_group_size(rt, self.k_normal, 64 if rt.info.is_cpu else 256)
        self._preconditioner_index(blocks, blk, pos, key, e)
        self.description = f"implicit products over {nk} keys of {K} columns on {rt.info.name}"
        self.covered = self.obs
        self.Jc = self.Jp = self.f = None

    def _preconditioner_index(self, blocks, blk, pos, key, e):
        """Where the keys' K x K sums land in the diagonal blocks, and the shared rows' columns."""
        nf, K, nk = self.nf, self.K, self.nk
        blk, pos = np.append(blk, -1), np.append(pos, 0)             # the pad column: no block
        # Every group's blocks (size x size each, row-major) in one flat array, in turn.
        sizes = [T.shape[1] for T, _ in blocks]
        counts = [T.shape[0] * k * k for (T, _), k in zip(blocks, sizes)]
        self.offsets = [int(v) for v in np.cumsum([0] + counts[:-1])] if blocks else []
        self.flat_size = int(sum(counts))
        # Each block's first entry in that array, and its size.
        block_base = np.zeros(max(1, sum(T.shape[0] for T, _ in blocks)), np.int64)
        block_size = np.zeros_like(block_base)
        for (T, base), off, k in zip(blocks, self.offsets, sizes):
            block_base[base:base + T.shape[0]] = off + np.arange(T.shape[0]) * k * k
            block_size[base:base + T.shape[0]] = k
        c = np.where(self.copy_of >= 0, self.copy_of, nf).reshape(nk, K)
        b = blk[c]                                                    # (nk, K), -1: constant
        same = (b[:, :, None] == b[:, None, :]) & (b[:, :, None] >= 0)
        kk, ii, jj = np.nonzero(same)
        bb = b[kk, ii]
        self.key_src = (kk * K + ii) * K + jj                        # into (nk, K, K)
        self.key_dst = block_base[bb] + pos[c[kk, ii]] * block_size[bb] + pos[c[kk, jj]]
        # Rows held by more than one key: their W V^-1 W^T blocks are summed per point on the host.
        kb = np.unique(np.flatnonzero(b >= 0) // K * block_base.size + b[b >= 0])   # (key, block) pairs
        copies = np.bincount(kb % block_base.size, minlength=block_base.size)        # keys per block
        # The keys' own W V^-1 W^T (jacobi_sums) serves the rows one key holds, exactly.
        unshared = copies[np.maximum(b, 0)][kk, ii] == 1
        self.unshared_mask = np.zeros(nk * K * K, bool)
        self.unshared_mask[self.key_src[unshared]] = True
        self.unshared_mask = self.unshared_mask.reshape(nk, K, K)
        shared_cols = np.flatnonzero(((b >= 0) & (copies[np.maximum(b, 0)] > 1)).any(axis=0))
        self.shared_cols = shared_cols
        if shared_cols.size:
            o_k = np.repeat(key, shared_cols.size)
            o_j = np.tile(shared_cols, key.size)
            o_b = b[o_k, o_j]
            # Only shared blocks: a column can be shared in one key's row and not in another's
            # (a camera of two images beside a camera of one), whose block the key's sums give.
            keep = (o_b >= 0) & (copies[np.maximum(o_b, 0)] > 1)
            o_k, o_j, o_b = o_k[keep], o_j[keep], o_b[keep]
            o_obs = np.repeat(np.arange(key.size), shared_cols.size)[keep]
            o_e = e[o_obs]
            # One group per (shared block, eliminated row): the sum of its observations' rows;
            # numbered block by block, so that the groups' products sum per block by reduceat.
            gid = o_b * max(1, self.ne_rows) + o_e
            uniq, inv = unique_inverse(gid, block_base.size * max(1, self.ne_rows))
            self.h_obs, self.h_col = o_obs, np.searchsorted(shared_cols, o_j)
            self.h_group, self.h_pos = inv, pos[c[o_k, o_j]]
            self.h_e, h_block = uniq % max(1, self.ne_rows), uniq // max(1, self.ne_rows)
            self.h_first = np.flatnonzero(np.concatenate(([True], h_block[1:] != h_block[:-1])))
            blocks_h = h_block[self.h_first]
            self.h_max = m = int(block_size[blocks_h].max())
            i, j = np.meshgrid(np.arange(m), np.arange(m), indexing="ij")
            size = block_size[blocks_h][:, None, None]
            self.h_ok = (i[None] < size) & (j[None] < size)
            self.h_dst = (block_base[blocks_h][:, None, None] + i[None] * size + j[None])[self.h_ok]

    # -- per Jacobian -------------------------------------------------------------------------
    def prepare(self, F_full, E, r):
        """Per Jacobian: the kind's (n, R, K) and (n, R, kE) blocks and (n, R) residuals (an
        observation of a constant eliminated row: E zero), on the device in point order."""
        q = self.rt.queue
        if self.in_order:
            F, Ev, f = (np.ascontiguousarray(a, np.float64) for a in (F_full, E, r))
        else:
            F, Ev, f = (ordering.take(np.asarray(a, np.float64), self.obs) for a in (F_full, E, r))
        for name, a in (("Jc", F), ("Jp", Ev), ("f", f)):
            dev = getattr(self, name)
            if dev is None or dev.size != a.size:
                dev = arrays.scratch(self.rt, max(1, a.size), np.float64)
                setattr(self, name, dev)
            if a.size:
                dev.set(a.ravel(), queue=q)
        self.F_shared = F[:, :, self.shared_cols] if self.shared_cols.size else None
        self.E_sorted = Ev
        self.pcg.bind_jacobian(self.Jc, self.Jp, self.f)

    def covered_rows(self, offset: int) -> np.ndarray:
        """The rows of the problem's F (the kind's first at ``offset``) whose products the device
        gives: every residual of an observation of an active eliminated row."""
        return (offset + self.covered[:, None] * self.R + np.arange(self.R)).ravel()

    # -- per linear system --------------------------------------------------------------------
    def product(self, Vinv, y):
        """The kind's ``(F^T F - W V^-1 W^T) y`` for a problem vector ``y`` (nf)."""
        yv = np.append(y, 0.0)[self.gather]
        return sum_copies(self.copy_of, self.pcg.apply(Vinv, yv), self.nf)

    def reduced_residuals(self, Vinv):
        """The kind's ``F^T (f - E V^-1 E^T f)``: ``F^T f - W V^-1 g_E`` over its covered rows."""
        return sum_copies(self.copy_of, self.pcg.apply(Vinv), self.nf)

    def back_substitute(self, Vinv, ge, y):
        """``V^-1 (g_E - W^T y)`` per eliminated row (ne_rows, kE)."""
        yv = np.append(y, 0.0)[self.gather]
        return self.pcg.back_substitute(Vinv, ge, yv).astype(np.float64)

    def jacobi_blocks(self, Vinv):
        """The kind's part of ``S``'s diagonal blocks (``F^T F - W V^-1 W^T`` there), flat: every
        group's blocks (rows, size, size) in turn, as :meth:`_preconditioner_index` numbered them."""
        rt, K, nk = self.rt, self.K, self.nk
        flat = np.zeros(self.flat_size)
        if nk:
            self.k_normal(rt.queue, (arrays.round_up(nk * K, self.ls),), (self.ls,), self.Jc.data,
                          self.pcg.obs.data, self.key_start.data, self.normal.data, np.int32(nk))
            tri = np.empty((nk, K * (K + 1) // 2))
            cl.enqueue_copy(rt.queue, tri, self.normal.data)
            full = np.zeros((nk, K, K))
            rows, cols = np.triu_indices(K)
            full[:, rows, cols] = tri
            full[:, cols, rows] = tri
            full -= np.where(self.unshared_mask, self.pcg.jacobi_sums(Vinv), 0.0)
            flat += np.bincount(self.key_dst, weights=full.ravel()[self.key_src], minlength=self.flat_size)
        if self.shared_cols.size:
            flat -= self._shared_products(Vinv)
        return flat

    def _shared_products(self, Vinv):
        """``sum over eliminated rows p of H_pb V_p^-1 H_pb^T`` for the shared blocks b, with
        ``H_pb`` the sum of ``F_o^T E_o`` over p's observations o of b's columns, flat. Tiny
        products by broadcasting: numpy's einsum and matmul cost several times more here."""
        F, E = self.F_shared, self.E_sorted                              # (n, R, s), (n, R, kE)
        Gs = F[:, 0, :, None] * E[:, 0, None, :]
        for r in range(1, self.R):
            Gs += F[:, r, :, None] * E[:, r, None, :]                     # (n, s, kE)
        kE, m = self.kE, self.h_max
        ng = self.h_e.size
        H = np.zeros((ng * m, kE))
        rows = self.h_group * m + self.h_pos
        g = Gs[self.h_obs, self.h_col]                                   # (entries, kE)
        for k in range(kE):
            H[:, k] = np.bincount(rows, weights=g[:, k], minlength=ng * m)
        H = H.reshape(ng, m, kE)
        V = Vinv[self.h_e]                                               # (ng, kE, kE)
        HV = H[:, :, 0, None] * V[:, None, 0, :]
        for k in range(1, kE):
            HV += H[:, :, k, None] * V[:, None, k, :]                     # (ng, m, kE)
        P = HV[:, :, None, 0] * H[:, None, :, 0]
        for k in range(1, kE):
            P += HV[:, :, None, k] * H[:, None, :, k]                     # (ng, m, m)
        per_block = np.add.reduceat(P, self.h_first, axis=0)
        return np.bincount(self.h_dst, weights=per_block[self.h_ok], minlength=self.flat_size)

    def close(self):
        release_kernels(self, self.pcg)
