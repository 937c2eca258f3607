## sparse_schur's reduced camera system, assembled on the device (solvers/schur_reduced.py) from
## the Jacobian blocks, V^-1 and the camera normal equations, with the conventions of
## solvers/schur.py:
##
##   rhs_c  = gc_c - sum over c's observations o of F_o^T E_o V_p^-1 gp_p        (p = o's point)
##   S_ab   = [a == b] (B_a + Dc^2_a) - sum over the points p both see of G_ap V_p^-1 G_bp^T
##
## with F_o (R x C) and E_o (R x P) an observation's camera and point blocks and G_ap the sum of
## F_o^T E_o over camera a's observations of p. S_ab is summed pair by pair of observations,
## F_o1^T (E_o1 V_p^-1 E_o2^T) F_o2, whose middle factor is only R x R: nothing per observation
## or pair is stored.
##
##   reduced_rhs    one work-item per camera, over its observations
##   pair_partials  one work-item per run of at most a few hundred (camera-point group, camera-point
##                  group) pairs of one block of S, its partial sum of the pairs' products
##   reduced_blocks one work-item per nonzero block (a <= b): B + Dc^2 - its runs' partials, into
##                  OUT = "blocks": (nblocks, C, C), S_ab as it is; or OUT = "dense": the lower
##                  triangle of the row-major dense matrix (ld columns), S_ab^T at rows of b and
##                  columns of a (a diagonal block whole)
##
## A camera-point group is one camera's observations of one point (usually one): the index
## arrays list observations in camera order, grouped so. Every block is owned by one work-item
## (a gather; no atomics but the integer flag). A value that is not finite sets flag bit 0 (1).
## Parameters: C, P, R (block sizes), OUT.
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

__kernel void reduced_rhs(__global const double *restrict Jc,         // (n, R, C)
                          __global const double *restrict Jp,         // (n, R, P)
                          __global const double *restrict Vinv,       // (npt, P, P)
                          __global const double *restrict gc,         // (nc, C)
                          __global const double *restrict gp,         // (npt, P)
                          __global const int *restrict obs,           // (n) in camera order
                          __global const int *restrict group_start,   // (ngroups + 1) into obs
                          __global const int *restrict group_pt,      // (ngroups)
                          __global const int *restrict cam_group,     // (nc + 1): each camera's groups
                          __global double *restrict rhs,              // (nc, C)
                          __global int *restrict flag,
                          const int nc)
{
    const int c = get_global_id(0);
    if (c >= nc) return;
%for i in range(C):
    double acc${i} = 0.0;
%endfor
    for (int g = cam_group[c]; g < cam_group[c + 1]; ++g) {
        const int p = group_pt[g];
        __global const double *M = Vinv + (size_t)p * ${P * P};
        __global const double *gpp = gp + (size_t)p * ${P};
%for j in range(P):
        const double u${j} = ${' + '.join(f'M[{j * P + m}] * gpp[{m}]' for m in range(P))};
%endfor
        for (int k = group_start[g]; k < group_start[g + 1]; ++k) {
            const int o = obs[k];
            __global const double *E = Jp + (size_t)o * ${R * P};
            __global const double *F = Jc + (size_t)o * ${R * C};
%for r in range(R):
            const double t${r} = ${' + '.join(f'E[{r * P + j}] * u{j}' for j in range(P))};
%endfor
%for i in range(C):
            acc${i} += ${' + '.join(f'F[{r * C + i}] * t{r}' for r in range(R))};
%endfor
        }
    }
    int finite = 1;
%for i in range(C):
    {
        const double v = gc[(size_t)c * ${C} + ${i}] - acc${i};
        finite &= isfinite(v);
        rhs[(size_t)c * ${C} + ${i}] = v;
    }
%endfor
    if (!finite) atomic_or(flag, NOT_FINITE);
}

__kernel void pair_partials(__global const double *restrict Jc,        // (n, R, C)
                            __global const double *restrict Jp,        // (n, R, P)
                            __global const double *restrict Vinv,      // (npt, P, P)
                            __global const int *restrict obs,          // (n) in camera order
                            __global const int *restrict group_start,  // (ngroups + 1)
                            __global const int *restrict group_pt,     // (ngroups)
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
        const int ga = pair_a[e], gb = pair_b[e];
        __global const double *M = Vinv + (size_t)group_pt[ga] * ${P * P};
        for (int ka = group_start[ga]; ka < group_start[ga + 1]; ++ka) {
            const int oa = obs[ka];
            __global const double *Ea = Jp + (size_t)oa * ${R * P};
            __global const double *Fa = Jc + (size_t)oa * ${R * C};
            // t = E_a V^-1 (R x P)
%for r in range(R):
%for j in range(P):
            const double t${r}_${j} = ${' + '.join(f'Ea[{r * P + m}] * M[{m * P + j}]' for m in range(P))};
%endfor
%endfor
            for (int kb = group_start[gb]; kb < group_start[gb + 1]; ++kb) {
                const int ob = obs[kb];
                __global const double *Eb = Jp + (size_t)ob * ${R * P};
                __global const double *Fb = Jc + (size_t)ob * ${R * C};
                // w = F_a^T t E_b^T (C x R), then acc += w F_b
%for r in range(R):
%for q in range(R):
                const double m${r}_${q} = ${' + '.join(f't{r}_{j} * Eb[{q * P + j}]' for j in range(P))};
%endfor
%endfor
%for i in range(C):
%for q in range(R):
                const double w${i}_${q} = ${' + '.join(f'Fa[{r * C + i}] * m{r}_{q}' for r in range(R))};
%endfor
%endfor
%for j in range(C):
%for q in range(R):
                const double f${q}_${j} = Fb[${q * C + j}];
%endfor
%endfor
%for i in range(C):
%for j in range(C):
                acc${i}_${j} += ${' + '.join(f'w{i}_{q} * f{q}_{j}' for q in range(R))};
%endfor
%endfor
            }
        }
    }
    __global double *out = partial + (size_t)s * ${C * C};
%for i in range(C):
%for j in range(C):
    out[${i * C + j}] = acc${i}_${j};
%endfor
%endfor
}

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
%for i in range(C):
%for j in range(C):
    {
        double v = 0.0;
        for (int s = block_run[k]; s < block_run[k + 1]; ++s) v += partial[(size_t)s * ${C * C} + ${i * C + j}];
        v = a == b ? (B[(size_t)a * ${T} + ${upper[(i, j)]}] ${f'+ dc2[(size_t)a * {C} + {i}] ' if i == j else ''}- v) : -v;
        finite &= isfinite(v);
%if OUT == 'blocks':
        out[(size_t)k * ${C * C} + ${i * C + j}] = v;
%else:
        out[(size_t)(b * ${C} + ${j}) * ld + a * ${C} + ${i}] = v;
%endif
    }
%endfor
%endfor
    if (!finite) atomic_or(flag, NOT_FINITE);
}
