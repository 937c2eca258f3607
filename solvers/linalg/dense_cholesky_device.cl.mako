## A dense Cholesky factorisation A = L L^T and the two triangular solves, in REAL (double or
## float), for a symmetric positive definite matrix that lives on the device
## (solvers/linalg/dense_cholesky_device.py).
##
## The matrix is row-major, np x np, np a multiple of the block size NB: the caller pads it with
## an identity (L keeps that identity, the padded unknowns come out zero), so no kernel has a
## partial block. Only the lower triangle is read. Blocked and right-looking: per block column k
##
##   panel     every work-group factors the NB x NB diagonal block in local memory (the same
##             arithmetic in every group, so the same result); group 0 writes it to diag[] and
##             its inverse to dinv[], the others each solve NB rows of the panel below it,
##             X L_kk^T = A_ik, in place
##   update    the trailing lower triangle A_ij -= P_i P_j^T, one NB x NB tile per work-group,
##             RT x RT entries per work-item, the two panel tiles in local memory; deferred
##             over several block columns, it subtracts all their panels at once
##
## and per block row for the solves (b is overwritten):
##
##   forward   L z = b: per super-block (SS rows of L's diagonal), its solution z_k through its
##             inverse (forward_super), then the rows below subtract A_ik z_k (forward_update)
##   backward  L^T x = z: likewise from the last super-block up (backward_super), the columns
##             left of it subtracting A_kj^T x_k (backward_update)
##
## The solves multiply by inverted diagonal blocks instead of substituting through them: a
## substitution is NB dependent steps on one item, which set the time of each of the 2 np / NB
## solve launches (about 15 us of 17 on an H200); the product is NB independent sums. The
## super-blocks' inverses (super_inverse, after the factorisation) take that further: see there.
##
## The factored diagonal blocks go to diag[] instead of back into A: a group may not overwrite
## the diagonal block while the other groups of the same launch still read it. Each launch reads
## what the previous one wrote; the in-order queue orders them, with no host round trip.
##
## flag[0] (int): bit 1 (value 2) is set when a pivot is not positive and finite, as LAPACK's
## dpotrf fails; the factorisation then goes on with NaN, which the caller discards.
## Parameters: REAL (the storage and arithmetic type), NB (block size, a power of two), RT (update
## entries per work-item and dimension, a divisor of NB), SS (rows of a solve's super-block, a
## multiple of NB; SBS = SS / NB its blocks), LS (solve_small's work-group size), PW (the
## panel's work-items per row: 1, each row's updates on one item; more, spread over them). The
## host may defer the trailing update over several block columns (see update): the panel then
## also updates the rest of its deferred block's columns.
<%namespace name="common" file="/clkernels/common.cl.mako"/>
%if REAL == "double":
${common.fp64_pragma()}
%endif
<% TT = NB // RT; SBS = SS // NB %>
#define real ${REAL}
#define NB ${NB}
#define NOT_POSITIVE_DEFINITE 2

// A = the padded identity diag(0, ..., 0, 1, ..., 1) (ones from index n on), the padding of b
// zero, and the failure flag cleared: where every solve starts.
__kernel void clear(__global real *restrict A, __global real *restrict b,
                    __global int *restrict flag, const int n, const int np)
{
    const int j = get_global_id(0), i = get_global_id(1);
    if (i >= np || j >= np) return;
    A[(size_t)i * np + j] = (i == j && i >= n) ? (real)1 : (real)0;
    if (j == 0 && i >= n) b[i] = (real)0;
    if (i == 0 && j == 0) flag[0] = 0;
}

// The Cholesky factor of the NB x NB diagonal block at (k, k): its strictly lower part into L,
// its diagonal into d, by the unblocked right-looking algorithm; work-item r owns row r.
// Returns whether every pivot was positive and finite.
int factor_diagonal_block(__global const real *A, const int np, const int k,
                          __local real (*L)[NB + 1], __local real *d)
{
    const int r = get_local_id(0);
    for (int i = 0; i < NB; ++i) L[i][r] = A[(size_t)(k + i) * np + k + r];
    barrier(CLK_LOCAL_MEM_FENCE);
    int ok = 1;
    for (int j = 0; j < NB; ++j) {
        // L[j][j] is not written during step j (its root goes to d[j]), so every item reads it.
        const real pivot = L[j][j];
        ok &= pivot > (real)0 && isfinite(pivot);
        const real dj = sqrt(pivot);
        if (r > j) L[r][j] /= dj;
        if (r == j) d[j] = dj;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (r > j)
            for (int c = j + 1; c <= r; ++c) L[r][c] -= L[r][j] * L[c][j];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return ok;
}

%if PW == 1:
__kernel __attribute__((reqd_work_group_size(NB, 1, 1)))
void panel(__global real *restrict A, const int np, const int k,
           __global real *restrict diag,       // (np / NB, NB, NB): the factored diagonal blocks
           __global real *restrict dinv,       // (np / NB, NB, NB): their inverses
           __global int *restrict flag)
{
    __local real L[NB][NB + 1];
    __local real X[NB][NB + 1];
    __local real d[NB];
    const int r = get_local_id(0), g = get_group_id(0);
    const int row0 = k + g * NB;          // group 0: the diagonal block; the others: the panel
    if (g > 0)
        for (int i = 0; i < NB; ++i) X[i][r] = A[(size_t)(row0 + i) * np + k + r];
    const int ok = factor_diagonal_block(A, np, k, L, d);
    if (g == 0) {
        if (r == 0 && !ok) flag[0] |= NOT_POSITIVE_DEFINITE;
        __global real *out = diag + (size_t)(k / NB) * NB * NB;
        for (int i = 0; i < NB; ++i) out[i * NB + r] = r < i ? L[i][r] : (r == i ? d[i] : (real)0);
        // Column r of the inverse, L y = e_r by substitution, into X's column r (item r's own;
        // X is free in group 0). The other groups' panel solves take as long, so this costs
        // the launch nothing.
        for (int i = 0; i < r; ++i) X[i][r] = (real)0;
        X[r][r] = (real)1 / d[r];
        for (int i = r + 1; i < NB; ++i) {
            real s = (real)0;
            for (int m = r; m < i; ++m) s -= L[i][m] * X[m][r];
            X[i][r] = s / d[i];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        __global real *inv = dinv + (size_t)(k / NB) * NB * NB;
        for (int i = 0; i < NB; ++i) inv[i * NB + r] = X[i][r];
        return;
    }
    // Row r of X L^T = A_ik: forward substitution along the row, the item's own data.
    for (int j = 0; j < NB; ++j) {
        real x = X[r][j];
        for (int m = 0; m < j; ++m) x -= X[r][m] * L[j][m];
        X[r][j] = x / d[j];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < NB; ++i) A[(size_t)(row0 + i) * np + k + r] = X[i][r];
}
%else:
// The same panel with PW work-items per row (NB x PW items): every step's updates spread over
// the row's items, so a step is a few multiply-adds and two barriers instead of up to NB
// dependent ones on one item. Per step j, once column j is final (scaled by 1 / d_j): the
// diagonal block's trailing triangle, L_rc -= L_rj L_cj; the panel rows' X_rc -= X_rj L_cj
// (right-looking X L^T = A); group 0's inverse, Y = L^-1 from Y = I row by row,
// Y_ic -= L_ij Y_jc. Item (r, q) takes columns q, q + PW, ... of row r.
__kernel __attribute__((reqd_work_group_size(NB, ${PW}, 1)))
void panel(__global real *restrict A, const int np, const int k,
           __global real *restrict diag,       // (np / NB, NB, NB): the factored diagonal blocks
           __global real *restrict dinv,       // (np / NB, NB, NB): their inverses
           __global int *restrict flag)
{
    __local real L[NB][NB + 1];
    __local real X[NB][NB + 1];                 // the panel rows, or group 0's inverse
    __local real d[NB];
    const int r = get_local_id(0), q = get_local_id(1), g = get_group_id(0);
    const int row0 = k + g * NB;
    for (int i = q; i < NB; i += ${PW}) {
        L[i][r] = A[(size_t)(k + i) * np + k + r];
        X[i][r] = g > 0 ? A[(size_t)(row0 + i) * np + k + r] : (i == r ? (real)1 : (real)0);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    int ok = 1;
    for (int j = 0; j < NB; ++j) {
        const real pivot = L[j][j];             // final: step j - 1 made it
        ok &= pivot > (real)0 && isfinite(pivot);
        const real dj = sqrt(pivot), rj = (real)1 / dj;
        if (q == 0) {
            if (r > j) L[r][j] *= rj;
            if (g > 0) X[r][j] *= rj;
            else X[j][r] *= rj;                 // row j of the inverse
            if (r == j) d[j] = dj;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int c = q; c < NB; c += ${PW}) {
            if (c > j && c <= r) L[r][c] -= L[r][j] * L[c][j];
            if (g > 0) {
                if (c > j) X[r][c] -= X[r][j] * L[c][j];
            } else if (r > j) {
                X[r][c] -= L[r][j] * X[j][c];
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (g == 0) {
        if (r == 0 && q == 0 && !ok) flag[0] |= NOT_POSITIVE_DEFINITE;
        __global real *out = diag + (size_t)(k / NB) * NB * NB;
        __global real *inv = dinv + (size_t)(k / NB) * NB * NB;
        for (int i = q; i < NB; i += ${PW}) {
            out[i * NB + r] = r < i ? L[i][r] : (r == i ? d[i] : (real)0);
            inv[i * NB + r] = X[i][r];
        }
        return;
    }
    for (int i = q; i < NB; i += ${PW}) A[(size_t)(row0 + i) * np + k + r] = X[i][r];
}
%endif

// Tile q of the lower triangle of tiles, row-major: (ti, tj) with q = ti (ti + 1) / 2 + tj.
int2 lower_tile(const int q)
{
    int ti = (int)((sqrt((float)(8 * q + 1)) - 1.0f) / 2.0f);
    while (ti * (ti + 1) / 2 > q) --ti;              // the root may round either way
    while ((ti + 1) * (ti + 2) / 2 <= q) ++ti;
    return (int2)(ti, q - ti * (ti + 1) / 2);
}

// A_ij -= sum over s < ksub of P_i(s) P_j(s)^T, P(s) the factored block column k / NB + s, for
// tile (ti, tj) of A per work-group. ncols == 0: every tile of the lower triangle from block
// (c0, c0) on (the trailing update; q = get_group_id(0) as in lower_tile); ncols > 0: the tiles
// of block columns c0 .. c0 + ncols - 1 from the diagonal down (the columns left in a deferred
// block; group q = column * rows + offset, rows = np / NB - c0, past the last row it returns).
// Deferring the trailing update over several block columns reads and writes the trailing
// matrix once per ksub panels instead of once per panel: on GPUs that read-modify-write, not the
// arithmetic, bounds the factorisation. (Measured on an H100 at 16,002 unknowns: tiles stored
// transposed, so that each item reads its RT entries of a tile row as one vector, made the
// float64 factorisation 1.48x slower, the float32 one with 64 x 64 blocks no faster.)
__kernel __attribute__((reqd_work_group_size(${TT}, ${TT}, 1)))
void update(__global real *restrict A, const int np, const int k, const int ksub, const int c0,
            const int ncols)
{
    __local real Pi[NB][NB + 1];
    __local real Pj[NB][NB + 1];
    int ti, tj;
    if (ncols == 0) {
        const int2 t = lower_tile(get_group_id(0));
        ti = c0 + t.x;
        tj = c0 + t.y;
    } else {
        const int rows = np / NB - c0, q = get_group_id(0);
        tj = c0 + q / rows;
        ti = tj + q % rows;
        if (ti >= np / NB) return;       // the whole group: no barrier is left waiting
    }
    const int lx = get_local_id(0), ly = get_local_id(1), lid = ly * ${TT} + lx;
    const int row0 = ti * NB, col0 = tj * NB;
    // Item (lx, ly) owns rows ly + u TT and columns lx + v TT: neighbours in x write neighbouring
    // columns (coalesced) and read rows of Pj NB + 1 apart (no bank conflicts).
%for u in range(RT):
%for v in range(RT):
    real acc${u}_${v} = (real)0;
%endfor
%endfor
    for (int s = 0; s < ksub; ++s) {
        const int kc = k + s * NB;
        for (int e = lid; e < NB * NB; e += ${TT * TT}) {
            const int i = e / NB, m = e - i * NB;
            Pi[i][m] = A[(size_t)(row0 + i) * np + kc + m];
            Pj[i][m] = A[(size_t)(col0 + i) * np + kc + m];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int m = 0; m < NB; ++m) {
%for u in range(RT):
            const real a${u} = Pi[ly + ${u * TT}][m];
%endfor
%for v in range(RT):
            const real b${v} = Pj[lx + ${v * TT}][m];
%endfor
%for u in range(RT):
%for v in range(RT):
            acc${u}_${v} += a${u} * b${v};
%endfor
%endfor
        }
        barrier(CLK_LOCAL_MEM_FENCE);    // before the next panel's tiles overwrite Pi and Pj
    }
%for u in range(RT):
%for v in range(RT):
    A[(size_t)(row0 + ly + ${u * TT}) * np + col0 + lx + ${v * TT}] -= acc${u}_${v};
%endfor
%endfor
}

// The inverted diagonal block kb of dinv[] into Li (row-major, lower).
void load_inverse_block(__global const real *dinv, const int kb, __local real (*Li)[NB + 1])
{
    const int r = get_local_id(0);
    __global const real *src = dinv + (size_t)kb * NB * NB;
    for (int i = 0; i < NB; ++i) Li[i][r] = src[i * NB + r];
}

// w_r = (Li v)_r (lower) or (Li^T v)_r: row or column r of the inverted diagonal block times v.
real inverse_times(__local const real (*Li)[NB + 1], __local const real *v, const int r, const int transposed)
{
    real s = (real)0;
    if (transposed)
        for (int m = r; m < NB; ++m) s += Li[m][r] * v[m];
    else
        for (int m = 0; m <= r; ++m) s += Li[r][m] * v[m];
    return s;
}

// The per-block solves go super-block by super-block: SS rows (SBS = SS / NB blocks) of L's
// diagonal at a time, through the inverse of that diagonal super-block, which the
// factorisation leaves in sinv[] (super_inverse). A super-block's solution is then a product,
// SS independent sums, instead of SBS dependent sub-steps, and each solve takes two launches
// per super-block, not per block: the launches' host cost, not the device's work, set the
// solves' time on GPUs (H100, 16,002 unknowns, float32: 31-47 us of host time a launch
// against 11-36 us of kernel).

// sinv[j] (SS x SS, row-major) = the inverse of super-block j's diagonal part of L, block row
// by block row: X_ss = dinv_s, and for t < s X_st = -dinv_s sum_{u=t}^{s-1} L_su X_ut. Launch s
// (s = 0 .. SBS - 1): group (t, j) for t <= s forms X_st; a super-block with s blocks or fewer
// has nothing to do. Tiles and items as update's.
__kernel __attribute__((reqd_work_group_size(${TT}, ${TT}, 1)))
void super_inverse(__global const real *restrict A, const int np, __global const real *restrict dinv,
                   __global real *restrict sinv, const int s)
{
    __local real Pi[NB][NB + 1];
    __local real Pj[NB][NB + 1];
    const int t = get_group_id(0), j = get_group_id(1);
    const int b0 = j * ${SBS};                          // super-block j's first block
    if (t > s || (b0 + s) * NB >= np) return;           // the whole group
    const int lx = get_local_id(0), ly = get_local_id(1), lid = ly * ${TT} + lx;
    __global real *X = sinv + (size_t)j * ${SS * SS};
    __global const real *ds = dinv + (size_t)(b0 + s) * NB * NB;
    if (t == s) {
        // dinv's block, its upper triangle zero (dinv's is, but nothing else here relies on it).
        for (int e = lid; e < NB * NB; e += ${TT * TT}) {
            const int i = e / NB, m = e - i * NB;
            X[(size_t)(s * NB + i) * ${SS} + s * NB + m] = m <= i ? ds[e] : (real)0;
        }
        return;
    }
%for u in range(RT):
%for v in range(RT):
    real acc${u}_${v} = (real)0;
%endfor
%endfor
    for (int u = t; u < s; ++u) {
        // Pi = L_su (A's block (b0 + s, b0 + u)), Pj = X_ut (written by launch u or earlier).
        for (int e = lid; e < NB * NB; e += ${TT * TT}) {
            const int i = e / NB, m = e - i * NB;
            Pi[i][m] = A[(size_t)((b0 + s) * NB + i) * np + (b0 + u) * NB + m];
            Pj[i][m] = X[(size_t)(u * NB + i) * ${SS} + t * NB + m];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int m = 0; m < NB; ++m) {
%for u in range(RT):
            const real a${u} = Pi[ly + ${u * TT}][m];
%endfor
%for v in range(RT):
            const real b${v} = Pj[m][lx + ${v * TT}];
%endfor
%for u in range(RT):
%for v in range(RT):
            acc${u}_${v} += a${u} * b${v};
%endfor
%endfor
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    // Then X_st = -dinv_s C, C the sum above (into Pj), dinv_s's lower triangle into Pi.
%for u in range(RT):
%for v in range(RT):
    Pj[ly + ${u * TT}][lx + ${v * TT}] = acc${u}_${v};
    acc${u}_${v} = (real)0;
%endfor
%endfor
    for (int e = lid; e < NB * NB; e += ${TT * TT}) {
        const int i = e / NB, m = e - i * NB;
        Pi[i][m] = m <= i ? ds[e] : (real)0;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int m = 0; m < NB; ++m) {
%for u in range(RT):
        const real a${u} = Pi[ly + ${u * TT}][m];
%endfor
%for v in range(RT):
        const real b${v} = Pj[m][lx + ${v * TT}];
%endfor
%for u in range(RT):
%for v in range(RT):
        acc${u}_${v} += a${u} * b${v};
%endfor
%endfor
    }
%for u in range(RT):
%for v in range(RT):
    X[(size_t)(s * NB + ly + ${u * TT}) * ${SS} + t * NB + lx + ${v * TT}] = -acc${u}_${v};
%endfor
%endfor
}

// The super-block at row k (nsub blocks, sinv[j]): group q forms its NB entries of the
// solution, dst = X_j src (forward) or X_j^T src (backward), entries from `limit` on not stored.
// Forward: row q NB + r of X_j, its tiles staged (coalesced) in T; backward: column q NB + r,
// neighbouring items on neighbouring entries of each row.
<%def name="super_solve(name, transposed)">
__kernel __attribute__((reqd_work_group_size(NB, 1, 1)))
void ${name}(__global const real *restrict sinv, const int j, const int k, const int nsub,
             __global const real *restrict src, __global real *restrict dst, const int limit)
{
    __local real v[${SS}];
%if not transposed:
    __local real T[NB][NB + 1];
%endif
    const int r = get_local_id(0), q = get_group_id(0);
    for (int c = r; c < nsub * NB; c += NB) v[c] = src[k + c];
    barrier(CLK_LOCAL_MEM_FENCE);
    __global const real *X = sinv + (size_t)j * ${SS * SS};
    real s = (real)0;
%if not transposed:
    for (int t = 0; t <= q; ++t) {
        for (int i = 0; i < NB; ++i) T[i][r] = X[(size_t)(q * NB + i) * ${SS} + t * NB + r];
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int c = 0; c < NB; ++c) s += T[r][c] * v[t * NB + c];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
%else:
    for (int c = q * NB; c < nsub * NB; ++c) s += X[(size_t)c * ${SS} + q * NB + r] * v[c];
%endif
    if (k + q * NB + r < limit) dst[k + q * NB + r] = s;
}
</%def>
${super_solve("forward_super", False)}
${super_solve("backward_super", True)}

// L z = b below the super-block at row k (nsub blocks, its solution z_k): group g's NB rows
// subtract A_ik z_k from b, each tile of them staged (coalesced) in T.
__kernel __attribute__((reqd_work_group_size(NB, 1, 1)))
void forward_update(__global const real *restrict A, const int np, const int k, const int nsub,
                    __global const real *restrict z, __global real *restrict b)
{
    __local real T[NB][NB + 1];
    __local real w[${SS}];
    const int r = get_local_id(0), g = get_group_id(0);
    for (int c = r; c < nsub * NB; c += NB) w[c] = z[k + c];
    const int row0 = k + nsub * NB + g * NB;
    real s = (real)0;
    for (int t = 0; t < nsub; ++t) {
        for (int i = 0; i < NB; ++i) T[i][r] = A[(size_t)(row0 + i) * np + k + t * NB + r];
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int c = 0; c < NB; ++c) s += T[r][c] * w[t * NB + c];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    b[row0 + r] -= s;
}

// L^T x = z left of the super-block at row k (its solution x_k; entries from n on, the
// padding's, are zero): column g NB + r subtracts A_kj^T x_k from z, neighbouring items on
// neighbouring entries of each row.
__kernel __attribute__((reqd_work_group_size(NB, 1, 1)))
void backward_update(__global const real *restrict A, const int np, const int k, const int nsub,
                     __global const real *restrict x, __global real *restrict z, const int n)
{
    __local real w[${SS}];
    const int r = get_local_id(0), g = get_group_id(0);
    for (int c = r; c < nsub * NB; c += NB) w[c] = k + c < n ? x[k + c] : (real)0;
    barrier(CLK_LOCAL_MEM_FENCE);
    const int col = g * NB + r;
    real s = (real)0;
    for (int m = 0; m < nsub * NB; ++m) s += A[(size_t)(k + m) * np + col] * w[m];
    z[col] -= s;
}

// Both triangular solves, L z = b then L^T x = z, in one launch of one work-group of LS items,
// for matrices small enough that one group reading L beats a launch per block row (forward and
// backward above: two launches per block, each a few microseconds of host and device even when
// it does almost nothing). Block by block as those two, in the same order of operations: the
// first NB items form the diagonal block's solution, then every item updates its rows
// (columns) of what is left.
__kernel __attribute__((reqd_work_group_size(${LS}, 1, 1)))
void solve_small(__global const real *restrict A, const int np,
                 __global const real *restrict dinv,
                 __global real *restrict b,      // (np) overwritten
                 __global real *restrict z,      // (np) L^-1 b, overwritten
                 __global real *restrict x,      // (n) the solution
                 const int n)
{
    __local real Li[NB][NB + 1];
    __local real v[NB], w[NB];
    const int lid = get_local_id(0);
    for (int k = 0; k < np; k += NB) {
        if (lid < NB) {
            load_inverse_block(dinv, k / NB, Li);
            v[lid] = b[k + lid];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid < NB) w[lid] = inverse_times(Li, v, lid, 0);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid < NB) z[k + lid] = w[lid];
        for (int i = k + NB + lid; i < np; i += ${LS}) {
            real s = (real)0;
            for (int c = 0; c < NB; ++c) s += A[(size_t)i * np + k + c] * w[c];
            b[i] -= s;
        }
        // b's next block, written by other items, is read at the top of the next pass.
        barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    }
    for (int k = np - NB; k >= 0; k -= NB) {
        if (lid < NB) {
            load_inverse_block(dinv, k / NB, Li);
            v[lid] = z[k + lid];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid < NB) w[lid] = inverse_times(Li, v, lid, 1);
        barrier(CLK_LOCAL_MEM_FENCE);
        // (Stored after the barrier: PoCL 3.0 dropped this store when it sat beside w's.)
        if (lid < NB && k + lid < n) x[k + lid] = w[lid];
        // Columns left of block k, neighbouring items on neighbouring entries of each row.
        for (int col = lid; col < k; col += ${LS}) {
            real s = (real)0;
            for (int m = 0; m < NB; ++m) s += A[(size_t)(k + m) * np + col] * w[m];
            z[col] -= s;
        }
        barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    }
}
