## The float64 side of the mixed-precision dense solve (solvers/linalg/mixed_cholesky_device.py):
## the matrix S (row-major, np x np, its lower triangle assembled, the padding an identity) is
## copied into a float32 matrix that is factorised, and the solution is refined in float64
## against S itself.
##
##   demote     the lower triangle of S into the float32 matrix (np32 x np32: its block size may
##              differ, and its padding is an identity too), and S's upper triangle made
##              its mirror (the residual then reads whole rows); one 32 x 32 tile per group,
##              transposed through local memory so that both writes are coalesced
##   residual   r = b - S x and the scale of its rounding, |S| |x| + |b| (for the componentwise
##              backward error LAPACK's dsyrfs tests), one work-group per row, summed in a fixed
##              order
##   scale_down the float32 right-hand side r * s (s brings r to about 1: no float underflow
##              however small the residual gets)
##   accumulate x += c / s, c the float32 solution (or x = c / s, or x = 0)
##
## Parameters: LS (residual's work-group size, a power of two).
<%namespace name="common" file="/clkernels/common.cl.mako"/>
${common.fp64_pragma()}
#define TS 32

__kernel __attribute__((reqd_work_group_size(TS, 8, 1)))
void demote(__global double *restrict S, __global float *restrict A, __global int *restrict flag,
            const int np, const int np32)
{
    __local double T[TS][TS + 1];
    const int ti = get_group_id(1), tj = get_group_id(0);
    // Only lower tiles work; the others pass the barrier idle (PoCL 3.0 corrupted memory when
    // they returned before it here).
    const int lower = tj <= ti;
    const int lx = get_local_id(0), ly = get_local_id(1);
    if (ti == 0 && tj == 0 && lx == 0 && ly == 0) flag[0] = 0;     // the float32 factorisation's flag
    for (int u = ly; u < TS; u += 8) {
        const int i = ti * TS + u, j = tj * TS + lx;
        double v = 0.0;
        if (lower && i < np && j <= i) v = S[(size_t)i * np + j];
        // The float32 matrix's own padding (its block size may differ): the identity's.
        if (lower && i < np32 && j <= i)
            A[(size_t)i * np32 + j] = (i < np && j < np) ? (float)v : (i == j ? 1.0f : 0.0f);
        T[u][lx] = v;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    // Entry (r, c) above the diagonal is S[c][r] = T[lx][u].
    for (int u = ly; u < TS; u += 8) {
        const int r = tj * TS + u, c = ti * TS + lx;
        if (lower && c < np && r < c) S[(size_t)r * np + c] = T[lx][u];
    }
}

__kernel __attribute__((reqd_work_group_size(${LS}, 1, 1)))
void residual(__global const double *restrict S, __global const double *restrict b,
              __global const double *restrict x,   // (n): the padding's unknowns are zero
              __global double *restrict r, __global double *restrict scale,
              const int np, const int n)
{
    __local double sum[${LS}], mag[${LS}];
    const int i = get_group_id(0), lid = get_local_id(0);
    __global const double *row = S + (size_t)i * np;
    double s = 0.0, a = 0.0;
    for (int j = lid; j < n; j += ${LS}) {
        s += row[j] * x[j];
        a += fabs(row[j] * x[j]);
    }
    sum[lid] = s;
    mag[lid] = a;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = ${LS} / 2; h > 0; h >>= 1) {
        if (lid < h) {
            sum[lid] += sum[lid + h];
            mag[lid] += mag[lid + h];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) {
        r[i] = b[i] - sum[0];
        scale[i] = mag[0] + fabs(b[i]);
    }
}

__kernel void scale_down(__global const double *restrict r, __global float *restrict rs, const double s,
                         const int np, const int np32)
{
    const int i = get_global_id(0);
    if (i < np32) rs[i] = i < np ? (float)(r[i] * s) : 0.0f;
}

// mode 0: x = c / s, 1: x += c / s, 2: x = 0 (a zero right-hand side: c is not read, it may
// hold anything, NaN included).
__kernel void accumulate(__global double *restrict x, __global const float *restrict c, const double inv_s,
                         const int n, const int mode)
{
    const int i = get_global_id(0);
    if (i >= n) return;
    if (mode == 2) x[i] = 0.0;
    else x[i] = mode == 0 ? (double)c[i] * inv_s : x[i] + (double)c[i] * inv_s;
}
