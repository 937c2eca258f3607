## sparse_schur's reduced camera system, assembled on the device (solvers/linalg/schur_reduced_device.py) from
## the Jacobian blocks, V^-1 and the camera normal equations, with the conventions of
## solvers/ba/schur.py:
##
##   rhs_c  = gc_c - sum over c's observations o of F_o^T E_o V_p^-1 gp_p        (p = o's point)
##   S_ab   = [a == b] (B_a + Dc^2_a) - sum over the points p both see of G_ap V_p^-1 G_bp^T
##
## with F_o (R x C) and E_o (R x P) an observation's camera and point blocks and G_ap the sum of
## F_o^T E_o over camera a's observations of p. S_ab is summed over the pairs of camera-point
## groups, Z_ap G_bp^T with Z = G V^-1: G and Z are stored once per group (2 C P values), nothing
## per pair; neighbouring work-items own neighbouring rows of a run's sum.
##
##   group_blocks   one work-item per camera-point group g: G_g = sum F_o^T E_o and Z_g = G_g V_p^-1
##   rhs_partials   one work-item per (run of a camera's groups, row): sum of Z_g gp_p
##   reduced_rhs    one work-item per camera entry: gc less its runs' sums
##   pair_partials  one work-item per (run of at most a few hundred (group, group) pairs of one
##                  block of S, row): its partial sum of Z_ga G_gb^T
##   reduced_blocks one work-item per nonzero block (a <= b): B + Dc^2 - its runs' partials, into
##                  OUT = "blocks": (nblocks, C, C), S_ab as it is; or OUT = "dense": the lower
##                  triangle of the row-major dense matrix (ld columns), S_ab^T at rows of b and
##                  columns of a (a diagonal block whole)
##
## A camera-point group is one camera's observations of one point (usually one): the index
## arrays list observations in camera order, grouped so. Every block is owned by one work-item
## (a gather; no atomics but the integer flag). A value that is not finite sets flag bit 0 (1).
## Parameters: C, P, R (block sizes), OUT, WHOLE_RUN (pair_partials: a work-item per run, not per
## row of it). OUT = None renders the first four kernels, OUT = "blocks" or "dense" reduced_blocks
## alone: a solve uses one output, and the unrolled variants compile slowly on NVIDIA's driver
## (a second or more each), so the variant the solve does not use is never built.
<%namespace name="common" file="/clkernels/common.cl.mako"/>
${common.fp64_pragma()}
<%
    T = C * (C + 1) // 2
    # index of B's entry (i, j) in its stored upper triangle (row-major, i <= j; lm_device.cl.mako)
    pairs = [(i, j) for i in range(C) for j in range(i, C)]
    upper = {}
    for t, (i, j) in enumerate(pairs):
        upper[(i, j)] = upper[(j, i)] = t
%>
#define NOT_FINITE 1

%if OUT is None:
// Per camera-point group g (camera a, point p): G_g = sum over its observations of F_o^T E_o and
// Z_g = G_g V_p^-1, both C x P, row-major, into GZ[g] = (G_g, Z_g).
__kernel void group_blocks(__global const double *restrict Jc,         // (n, R, C)
                           __global const double *restrict Jp,         // (n, R, P)
                           __global const double *restrict Vinv,       // (npt, P, P)
                           __global const int *restrict obs,           // (n) in camera order
                           __global const int *restrict group_start,   // (ngroups + 1) into obs
                           __global const int *restrict group_pt,      // (ngroups)
                           __global double *restrict GZ,               // (ngroups, 2, C, P)
                           const int ngroups)
{
    const int g = get_global_id(0);
    if (g >= ngroups) return;
%for i in range(C):
%for j in range(P):
    double g${i}_${j} = 0.0;
%endfor
%endfor
    for (int k = group_start[g]; k < group_start[g + 1]; ++k) {
        __global const double *F = Jc + (size_t)obs[k] * ${R * C};
        __global const double *E = Jp + (size_t)obs[k] * ${R * P};
%for i in range(C):
%for j in range(P):
        g${i}_${j} += ${' + '.join(f'F[{r * C + i}] * E[{r * P + j}]' for r in range(R))};
%endfor
%endfor
    }
    __global const double *M = Vinv + (size_t)group_pt[g] * ${P * P};
    __global double *out = GZ + (size_t)g * ${2 * C * P};
%for i in range(C):
%for j in range(P):
    out[${i * P + j}] = g${i}_${j};
    out[${C * P + i * P + j}] = ${' + '.join(f'g{i}_{m} * M[{m * P + j}]' for m in range(P))};
%endfor
%endfor
}

// One work-item per (run of a camera's groups, row i of rhs): sum over the groups of (Z_g gp_p)_i.
__kernel void rhs_partials(__global const double *restrict GZ,         // (ngroups, 2, C, P)
                           __global const int *restrict group_pt,      // (ngroups)
                           __global const double *restrict gp,         // (npt, P)
                           __global const int *restrict rhs_run_start, // (nrhs_runs + 1) into groups
                           __global double *restrict rhs_partial,      // (nrhs_runs, C)
                           const int nrhs_runs)
{
    const int gid = get_global_id(0), s = gid / ${C}, i = gid - s * ${C};
    if (s >= nrhs_runs) return;
    double acc = 0.0;
    for (int g = rhs_run_start[s]; g < rhs_run_start[s + 1]; ++g) {
        __global const double *z = GZ + (size_t)g * ${2 * C * P} + ${C * P} + i * ${P};
        __global const double *u = gp + (size_t)group_pt[g] * ${P};
        acc += ${' + '.join(f'z[{k}] * u[{k}]' for k in range(P))};
    }
    rhs_partial[gid] = acc;
}

// rhs = gc - W V^-1 gp, one work-item per camera entry: gc less its runs' partial sums.
__kernel void reduced_rhs(__global const double *restrict gc,          // (nc, C)
                          __global const double *restrict rhs_partial, // (nrhs_runs, C)
                          __global const int *restrict cam_rhs_run,    // (nc + 1)
                          __global double *restrict rhs,               // (nc, C)
                          __global int *restrict flag,
                          const int nc)
{
    const int i = get_global_id(0), c = i / ${C}, a = i - c * ${C};
    if (c >= nc) return;
    double acc = 0.0;
    for (int s = cam_rhs_run[c]; s < cam_rhs_run[c + 1]; ++s) acc += rhs_partial[(size_t)s * ${C} + a];
    const double v = gc[i] - acc;
    rhs[i] = v;
    if (!isfinite(v)) atomic_or(flag, NOT_FINITE);
}

%if WHOLE_RUN:
// One work-item per run of one block's group pairs (CPUs): the run's whole C x C sum of
// Z_ga G_gb^T, each pair's Z and G read once (the work-item per row below reads G once per
// row: C times). Every entry sums the same terms in the same order as there.
__kernel void pair_partials(__global const double *restrict GZ,        // (ngroups, 2, C, P)
                            __global const int *restrict pair_a,       // (npairs): group of camera a
                            __global const int *restrict pair_b,       // (npairs): group of camera b
                            __global const int *restrict run_start,    // (nruns + 1) into the pairs
                            __global double *restrict partial,         // (nruns, C, C)
                            const int nruns)
{
    const int s = get_global_id(0);
    if (s >= nruns) return;
%for i in range(C):
%for j in range(C):
    double acc${i}_${j} = 0.0;
%endfor
%endfor
    for (int e = run_start[s]; e < run_start[s + 1]; ++e) {
        __global const double *z = GZ + (size_t)pair_a[e] * ${2 * C * P} + ${C * P};
        __global const double *G = GZ + (size_t)pair_b[e] * ${2 * C * P};
%for i in range(C):
%for j in range(C):
        acc${i}_${j} += ${' + '.join(f'z[{i * P + k}] * G[{j * P + k}]' for k in range(P))};
%endfor
%endfor
    }
    __global double *out = partial + (size_t)s * ${C * C};
%for i in range(C):
%for j in range(C):
    out[${i * C + j}] = acc${i}_${j};
%endfor
%endfor
}
%else:
// One work-item per (run of one block's group pairs, row i): row i of the run's sum of
// Z_ga G_gb^T (= F_a^T E_a V_p^-1 E_b^T F_b summed over the groups' observations).
__kernel void pair_partials(__global const double *restrict GZ,        // (ngroups, 2, C, P)
                            __global const int *restrict pair_a,       // (npairs): group of camera a
                            __global const int *restrict pair_b,       // (npairs): group of camera b
                            __global const int *restrict run_start,    // (nruns + 1) into the pairs
                            __global double *restrict partial,         // (nruns, C, C)
                            const int nruns)
{
    const int gid = get_global_id(0), s = gid / ${C}, i = gid - s * ${C};
    if (s >= nruns) return;
%for j in range(C):
    double acc${j} = 0.0;
%endfor
    for (int e = run_start[s]; e < run_start[s + 1]; ++e) {
        __global const double *z = GZ + (size_t)pair_a[e] * ${2 * C * P} + ${C * P} + i * ${P};
        __global const double *G = GZ + (size_t)pair_b[e] * ${2 * C * P};
%for k in range(P):
        const double z${k} = z[${k}];
%endfor
%for j in range(C):
        acc${j} += ${' + '.join(f'z{k} * G[{j * P + k}]' for k in range(P))};
%endfor
    }
    __global double *out = partial + (size_t)gid * ${C};
%for j in range(C):
    out[${j}] = acc${j};
%endfor
}
%endif
%else:

// B's stored upper-triangle index of entry (i, j), i * C + j.
__constant int UPPER[${C * C}] = {${', '.join(str(upper[(i, j)]) for i in range(C) for j in range(C))}};

__kernel void reduced_blocks(__global const double *restrict B,          // (nc, T) upper triangles
                             __global const double *restrict dc2,        // (nc, C)
                             __global const double *restrict partial,    // (nruns, C, C)
                             __global const int *restrict block_run,     // (nblocks + 1)
                             __global const int *restrict block_row,     // (nblocks): camera a
                             __global const int *restrict block_col,     // (nblocks): camera b >= a
                             __global double *restrict out,
                             __global int *restrict flag,
                             const int nblocks, const int ld)
{
    const int k = get_global_id(0);
    if (k >= nblocks) return;
    const int a = block_row[k], b = block_col[k];
    int finite = 1;
    // A loop over the block's entries, not unrolled C x C times: unrolled, this one kernel took
    // NVIDIA's compiler 1.6-1.9 s (the cold start's longest build) for no faster reads.
    for (int ij = 0; ij < ${C * C}; ++ij) {
        const int i = ij / ${C}, j = ij - i * ${C};
        double v = 0.0;
        for (int s = block_run[k]; s < block_run[k + 1]; ++s) v += partial[(size_t)s * ${C * C} + ij];
        const size_t at = (size_t)a * ${T} + UPPER[ij];
        v = a == b ? ((i == j ? B[at] + dc2[(size_t)a * ${C} + i] : B[at]) - v) : -v;
        finite &= isfinite(v);
%if OUT == 'blocks':
        out[(size_t)k * ${C * C} + ij] = v;
%else:
        out[(size_t)(b * ${C} + j) * ld + a * ${C} + i] = v;
%endif
    }
    if (!finite) atomic_or(flag, NOT_FINITE);
}
%endif
