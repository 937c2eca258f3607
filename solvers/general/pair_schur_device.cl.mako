## The general core's reduction W V^-1 W^T on the device (solvers/general/pair_schur_device.py), summed
## from the columns of the observations' keys into the problem's columns.
##
## The keys' matrix A (the "virtual" columns: K per key, key k's columns k*K .. k*K+K-1) is
## written by schur_reduced_device.cl.mako's reduced_blocks with B = 0 and Dc^2 = 0, so it holds
## -W V^-1 W^T, its block lower triangle (rows of key b, columns of key a <= b; a key's diagonal
## block whole). A virtual column is a copy of one problem column (or of none: a constant
## entry); a column of a group that many keys share (intrinsics) has many copies.
## Parameters: K, R.
<%namespace name="common" file="/clkernels/common.cl.mako"/>
${common.fp64_pragma()}
<%
    # B's stored upper triangle, row-major (i <= j): as schur_reduced_device.cl.mako reads it.
    T = K * (K + 1) // 2
    row_start = [sum(K - m for m in range(i)) for i in range(K)]
%>
__constant int ROW_START[${K}] = {${', '.join(str(v) for v in row_start)}};

// One work-item per (key k, row i): row i of B_k = sum over the key's observations o of
// F_o^T F_o (the key's block of F^T F, which reduced_blocks puts on the keys' diagonal blocks),
// its entries j >= i into the stored upper triangle. Each observation's row is read once per i.
__kernel void key_normal(__global const double *restrict Jc,         // (n, R, K)
                         __global const int *restrict obs,           // positions in Jc, key order
                         __global const int *restrict key_start,     // (nk + 1) into obs
                         __global double *restrict B,                // (nk, T)
                         const int nk)
{
    const int gid = get_global_id(0), k = gid / ${K}, i = gid - k * ${K};
    if (k >= nk) return;
%for j in range(K):
    double acc${j} = 0.0;
%endfor
    for (int a = key_start[k]; a < key_start[k + 1]; ++a) {
        __global const double *F = Jc + (size_t)obs[a] * ${R * K};
%for r in range(R):
        {
            const double fi = F[${r * K} + i];
%for j in range(K):
            acc${j} += fi * F[${r * K + j}];
%endfor
        }
%endfor
    }
    __global double *out = B + (size_t)k * ${T} + ROW_START[i] - i;    // entry (i, j) at out[j]
%for j in range(K):
    if (${j} >= i) out[${j}] = acc${j};
%endfor
}

// The keys' matrix summed into the problem's columns in two passes, so that no work-item sums
// more than one column's copies (a shared camera's intrinsics have one per image: summed in one
// pass, each of their nf x nf entries would add copies x copies terms in one work-item, a
// serial chain of a million loads at 1,000 images).
//
// compress_columns: one work-item per (virtual row u, problem column j):
//   C[u, j] = sum over the copies v of column j of (W V^-1 W^T)[u, v]   (nv x nf, row-major)
__kernel void compress_columns(__global const double *restrict A,  // (ld, ld) keys' matrix
                               const int ld,
                               __global const int *restrict copy_start, // (nf + 1) into copy_col
                               __global const int *restrict copy_col,   // virtual columns per column
                               __global double *restrict C,
                               const int nf)
{
    const size_t gid = get_global_id(0);
    if (gid >= (size_t)ld * nf) return;
    const int u = (int)(gid / nf), j = (int)(gid - (size_t)u * nf), key_u = u / ${K};
    double acc = 0.0;
    for (int b = copy_start[j]; b < copy_start[j + 1]; ++b) {
        const int v = copy_col[b];
        // The written triangle: the row's key at or after the column's.
        acc += v / ${K} <= key_u ? A[(size_t)u * ld + v] : A[(size_t)v * ld + u];
    }
    C[gid] = acc;
}

// compress_rows: one work-item per entry (i, j) of the problem's nf x nf matrix (row-major,
// ld_out columns; both triangles, or with lower != 0 the lower one, j <= i):
//   out[i, j] = sign * sum over the copies u of column i of C[u, j]
__kernel void compress_rows(__global const double *restrict C,     // (nv, nf)
                            __global const int *restrict copy_start,
                            __global const int *restrict copy_col,
                            __global double *restrict out,
                            const int ld_out, const int nf, const int lower, const double sign)
{
    const size_t gid = get_global_id(0);
    if (gid >= (size_t)nf * nf) return;
    const int i = (int)(gid / nf), j = (int)(gid - (size_t)i * nf);
    if (lower && j > i) return;
    double acc = 0.0;
    for (int a = copy_start[i]; a < copy_start[i + 1]; ++a) acc += C[(size_t)copy_col[a] * nf + j];
    // A holds -W V^-1 W^T.
    out[(size_t)i * ld_out + j] = -sign * acc;
}

// One work-item per row i: the lower triangle of out (row-major, ld columns) gets the entries of
// row i of the CSR matrix M at columns j <= i, and d[i] on its diagonal.
__kernel void add_lower(__global double *restrict out, const int ld,
                        __global const int *restrict indptr,       // (nf + 1)
                        __global const int *restrict indices,
                        __global const double *restrict data,
                        __global const double *restrict d,         // (nf)
                        const int nf)
{
    const int i = get_global_id(0);
    if (i >= nf) return;
    __global double *row = out + (size_t)i * ld;
    for (int k = indptr[i]; k < indptr[i + 1]; ++k) {
        const int j = indices[k];
        if (j <= i) row[j] += data[k];
    }
    row[i] += d[i];
}

// Vectors over the keys' columns and over the problem's (solvers/general/key_copies_device.py). A key column is
// a copy of one problem column, or of none (a constant entry); column j's copies are
// copy_col[copy_start[j] .. copy_start[j + 1]).
//
// copies_sum: one work-item per problem column j: every copy of j in v gets the sum over them
// (a column of one copy is left as it is).
__kernel void copies_sum(__global double *restrict v,
                         __global const int *restrict copy_start, __global const int *restrict copy_col,
                         const int nf)
{
    const int j = get_global_id(0);
    if (j >= nf || copy_start[j + 1] - copy_start[j] < 2) return;
    double acc = 0.0;
    for (int a = copy_start[j]; a < copy_start[j + 1]; ++a) acc += v[copy_col[a]];
    for (int a = copy_start[j]; a < copy_start[j + 1]; ++a) v[copy_col[a]] = acc;
}

// to_columns: out[j] = the sum over the copies of column j of v.
__kernel void to_columns(__global const double *restrict v,
                         __global const int *restrict copy_start, __global const int *restrict copy_col,
                         __global double *restrict out, const int nf)
{
    const int j = get_global_id(0);
    if (j >= nf) return;
    double acc = 0.0;
    for (int a = copy_start[j]; a < copy_start[j + 1]; ++a) acc += v[copy_col[a]];
    out[j] = acc;
}

// to_copies: out[u] = y[column of u], or 0 for a key column that copies none.
__kernel void to_copies(__global const double *restrict y, __global const int *restrict column,
                        __global double *restrict out, const int nv)
{
    const int u = get_global_id(0);
    if (u >= nv) return;
    const int j = column[u];
    out[u] = j >= 0 ? y[j] : 0.0;
}
