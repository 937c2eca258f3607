## The per-iteration work of Levenberg-Marquardt that is not the linear solve, on the device
## (solvers/ba/lm_device.py), for residual blocks of R entries, camera blocks of C parameters and
## point blocks of P parameters (render parameters, from the model):
##
##   correct_jacobian   per observation: Ceres' robust-loss correction of r, Jc, Jp in place and the
##                      observation's rho (NaN when anything is not finite): the cost's terms
##   residual_cost      the same rho from residuals alone (the candidate's cost)
##   point_normal       per point: V = sum Jp^T Jp (P x P) and gp = sum Jp^T r
##   camera_partials    per run of one camera's observations: the upper triangle of Jc^T Jc and Jc^T r
##   camera_normal      per camera: its runs' sums -> B (upper triangle) and gc
##   jacobi_scale       s = 1 / (1 + sqrt(diag(J^T J))) (Ceres' Jacobi scaling), or ones
##   lm_diagonal        diag = clamp(diag(J^T J) s^2, min, max) (LevenbergMarquardtStrategy)
##   camera_regularize  Dc^2 = (sqrt(diag / radius) / s)^2
##   point_regularize   V^-1 of V + Dp^2 per point
##   schur_jacobi       per camera: the inverse of S's diagonal block B + Dc^2 - sum G V^-1 G^T
##                      (of each of its parameter blocks' diagonal blocks, for a merged camera)
##   hold_constants     per observation: zero the Jacobian columns of constant camera entries
##   make_step          y = raw / s, delta = -y s, candidate = x + delta
##   model_change       per observation: m = Jc dc + Jp dp and m . (r + m / 2)
##   reduce_*, finish   two-stage reductions (fixed shape: the same sums in the same order every run)
##
## Vectors over all parameters are a camera part (nc * C) and a point part (npt * P), two buffers:
## a kernel over "i < total" reads the camera part for i < ncC and the point part after it.
## Parameters: C, P, R, L (reduction work-group size, a power of two), LOSS (Ceres' loss name),
## REAL (the storage type), ACC (the arithmetic and the sums: double where the device has it) and
## BLOCKS (the sizes of the parameter blocks a camera merges, solvers.general.merged_groups; (C,) for one)
## and COPIES (a camera column may be a copy of a column that other cameras share, as a shared
## camera's intrinsics in merged groups: the camera part's column norms come summed over the
## copies in cd, the norms count each column once, by count_c, and Dc^2 is put on one copy).
<%!
    # A vector over all parameters as its two buffers, and element i of it (see the header).
    def vec_args(name, const=True):
        q = 'const ' if const else ''
        return f"__global {q}real *restrict {name}_c, __global {q}real *restrict {name}_p"

    def at(name):
        return f"(i < ncC ? {name}_c[i] : {name}_p[i - ncC])"

    def put(name, value):
        return f"if (i < ncC) {name}_c[i] = {value}; else {name}_p[i - ncC] = {value};"
%>
<%namespace name="common" file="/clkernels/common.cl.mako"/>
${common.fp64_pragma()}
typedef ${REAL} real;   // storage: Jacobian blocks, residuals, vectors
typedef ${ACC} acc;     // arithmetic and sums: double wherever the device has it
<%
    T = C * (C + 1) // 2
    tri = [(a, b) for a in range(C) for b in range(a, C)]
%>
// Ceres clamps rho' from below by the smallest normal acc (a far outlier keeps a tiny weight).
#define TINY ${'0x1p-1022' if ACC == 'double' else '0x1p-126f'}

// rho(s), rho'(s), rho''(s) of Ceres' loss (a = scale, b = a^2), as solvers/models/loss.py.
void loss_eval(const acc s, const acc a, const acc b, acc *rho)
{
%if LOSS == 'trivial':
    rho[0] = s; rho[1] = 1.0; rho[2] = 0.0;
%elif LOSS == 'huber':
    if (s > b) {
        const acc r = sqrt(s);
        rho[0] = 2.0 * a * r - b;
        rho[1] = fmax(TINY, a / r);
        rho[2] = -rho[1] / (2.0 * s);
    } else {
        rho[0] = s; rho[1] = 1.0; rho[2] = 0.0;
    }
%elif LOSS == 'soft_l1':
    const acc c = 1.0 / b, total = 1.0 + s * c, tmp = sqrt(total);
    rho[0] = 2.0 * b * (tmp - 1.0);
    rho[1] = fmax(TINY, 1.0 / tmp);
    rho[2] = -(c * rho[1]) / (2.0 * total);
%elif LOSS == 'cauchy':
    const acc c = 1.0 / b, total = 1.0 + s * c, inv = 1.0 / total;
    rho[0] = b * log(total);
    rho[1] = fmax(TINY, inv);
    rho[2] = -c * (inv * inv);
%endif
}

// One observation's cost term rho(|r|^2), NaN unless r is finite and `finite` is set; its
// squared norm and the loss' derivatives come back in s and rho[].
acc observation_rho(__global const real *ro, int finite, const acc a, const acc b,
                       acc *s, acc *rho)
{
%for k in range(R):
    finite &= isfinite(ro[${k}]);
%endfor
    *s = ${' + '.join(f'ro[{k}] * ro[{k}]' for k in range(R))};
    loss_eval(*s, a, b, rho);
    return finite ? rho[0] : NAN;
}

// The kernels come in three parts, built as three programs of the same source (-D LM_PARTS=1, 2
// and 4, a bit each) so that NVIDIA's compiler, 1.9-2.4 s for the whole, builds them side by side
// in worker processes (clkernels.build_pool); schur_jacobi, the slowest to compile, is a part of
// its own. Without LM_PARTS, one program has all.
#ifndef LM_PARTS
#define LM_PARTS 7
#endif
#if LM_PARTS & 1

__kernel void residual_cost(__global const real *restrict r,   // (n, R)
                            __global acc *restrict value,     // (n)
                            const int n, const acc a, const acc b)
{
    const int o = get_global_id(0);
    if (o >= n) return;
    acc s, rho[3];
    value[o] = observation_rho(r + (size_t)o * ${R}, 1, a, b, &s, rho);
}

// Ceres' Corrector (solvers/models/loss.py: correct): r~ = sqrt(rho') / (1 - alpha) r and
// J~ = sqrt(rho') (I - alpha r r^T / s) J where rho'' > 0, both scaled by sqrt(rho') elsewhere.
<%def name="correct_block(K, J)">
    {
        __global real *Jo = ${J} + (size_t)o * ${R * K};
        for (int j = 0; j < ${K}; ++j) {
            const acc rtJ = ${' + '.join(f'r0[{k}] * Jo[{k * K} + j]' for k in range(R))};
%for k in range(R):
            Jo[${k * K} + j] = Jo[${k * K} + j] * sqrt_rho1 - (sqrt_rho1 * alpha_sq_norm) * r0[${k}] * rtJ;
%endfor
        }
    }
</%def>
__kernel void correct_jacobian(__global real *restrict r,     // (n, R)
                               __global real *restrict Jc,    // (n, R, C)
                               __global real *restrict Jp,    // (n, R, P)
                               __global acc *restrict value, // (n)
                               const int n, const acc a, const acc b)
{
    const int o = get_global_id(0);
    if (o >= n) return;
    __global real *ro = r + (size_t)o * ${R};
    int finite = 1;
    for (int j = 0; j < ${R * C}; ++j) finite &= isfinite(Jc[(size_t)o * ${R * C} + j]);
    for (int j = 0; j < ${R * P}; ++j) finite &= isfinite(Jp[(size_t)o * ${R * P} + j]);
    acc s, rho[3];
    value[o] = observation_rho(ro, finite, a, b, &s, rho);
%if LOSS != 'trivial':
    const acc sqrt_rho1 = sqrt(rho[1]);
    acc residual_scaling = sqrt_rho1, alpha_sq_norm = 0.0;
    if (s > 0.0 && rho[2] > 0.0) {
        const acc alpha = 1.0 - sqrt(1.0 + 2.0 * s * rho[2] / rho[1]);
        residual_scaling = sqrt_rho1 / (1.0 - alpha);
        alpha_sq_norm = alpha / s;
    }
    acc r0[${R}];
%for k in range(R):
    r0[${k}] = ro[${k}];
%endfor
${correct_block(C, 'Jc')}
${correct_block(P, 'Jp')}
%for k in range(R):
    ro[${k}] = r0[${k}] * residual_scaling;
%endfor
%endif
}

// Entries held constant (solvers.general.merged_groups): their Jacobian columns are zeroed, after the
// loss correction (which maps each column on its own, so a zero column stays zero), and so they
// get no gradient, no coupling in the normal equations and a step of exactly zero.
__kernel void hold_constants(__global real *restrict Jc,             // (n, R, C)
                             __global real *restrict Jp,             // (n, R, P)
                             __global const int *restrict cam,       // (n) camera of each observation
                             __global const int *restrict pt,        // (n) point of each observation
                             __global const uchar *restrict free_c,  // (cameras, C) 1 where it moves
                             __global const uchar *restrict free_p,  // (points, P)
                             const int n)
{
    const int o = get_global_id(0);
    if (o >= n) return;
%for X, M, K, idx in (('Jc', 'free_c', C, 'cam'), ('Jp', 'free_p', P, 'pt')):
    {
        __global const uchar *f = ${M} + (size_t)${idx}[o] * ${K};
        __global real *J = ${X} + (size_t)o * ${R * K};
%for j in range(K):
        if (!f[${j}]) {
%for r in range(R):
            J[${r * K + j}] = 0;
%endfor
        }
%endfor
    }
%endfor
}

__kernel void point_normal(__global const real *restrict Jp,       // (n, R, P)
                           __global const real *restrict r,        // (n, R)
                           __global const int *restrict pt_start,    // (npt + 1)
                           __global real *restrict V,              // (npt, P, P)
                           __global real *restrict gp,             // (npt, P)
                           const int npt)
{
    const int p = get_global_id(0);
    if (p >= npt) return;
%for a in range(P):
    acc g${a} = 0.0;
%for b in range(a, P):
    acc v${a}_${b} = 0.0;
%endfor
%endfor
    for (int o = pt_start[p]; o < pt_start[p + 1]; ++o) {
        __global const real *E = Jp + (size_t)o * ${R * P};
        __global const real *ro = r + (size_t)o * ${R};
%for a in range(P):
        g${a} += ${' + '.join(f'E[{k * P + a}] * ro[{k}]' for k in range(R))};
%for b in range(a, P):
        v${a}_${b} += ${' + '.join(f'E[{k * P + a}] * E[{k * P + b}]' for k in range(R))};
%endfor
%endfor
    }
%for a in range(P):
    gp[(size_t)p * ${P} + ${a}] = g${a};
%for b in range(P):
    V[(size_t)p * ${P * P} + ${a * P + b}] = v${min(a, b)}_${max(a, b)};
%endfor
%endfor
}

__kernel void camera_partials(__global const real *restrict Jc,      // (n, R, C)
                              __global const real *restrict r,       // (n, R)
                              __global const int *restrict obs,        // (n) in camera order
                              __global const int *restrict seg_start,  // (nseg + 1)
                              __global acc *restrict partial,       // (nseg, T + C)
                              const int nseg)
{
    const int s = get_global_id(0);
    if (s >= nseg) return;
%for t in range(T + C):
    acc acc${t} = 0.0;
%endfor
    for (int k = seg_start[s]; k < seg_start[s + 1]; ++k) {
        const int o = obs[k];
        __global const real *f = Jc + (size_t)o * ${R * C};
        __global const real *ro = r + (size_t)o * ${R};
%for t, (a, b) in enumerate(tri):
        acc${t} += ${' + '.join(f'f[{k * C + a}] * f[{k * C + b}]' for k in range(R))};
%endfor
%for a in range(C):
        acc${T + a} += ${' + '.join(f'f[{k * C + a}] * ro[{k}]' for k in range(R))};
%endfor
    }
%for t in range(T + C):
    partial[(size_t)s * ${T + C} + ${t}] = acc${t};
%endfor
}

// One work-item per camera and entry of (B, gc): neighbouring items read neighbouring partial
// sums (one item per camera looping over its T + C entries read them T + C apart, and took 0.2 ms
// a call for the 49 cameras of ladybug-49 on the H200). Each sum runs over the camera's segments
// in order, as before.
__kernel void camera_normal(__global const acc *restrict partial,   // (nseg, T + C)
                            __global const int *restrict cam_seg,      // (nc + 1)
                            __global real *restrict B,               // (nc, T)
                            __global real *restrict gc,              // (nc, C)
                            const int nc)
{
    const int item = get_global_id(0);
    if (item >= nc * ${T + C}) return;
    const int c = item / ${T + C}, t = item - c * ${T + C};
    acc sum = 0.0;
    for (int s = cam_seg[c]; s < cam_seg[c + 1]; ++s) sum += partial[(size_t)s * ${T + C} + t];
    if (t < ${T}) B[(size_t)c * ${T} + t] = sum;
    else gc[(size_t)c * ${C} + t - ${T}] = sum;
}

// diag(J^T J) at vector index i: B's diagonal for the camera part, V's for the point part.
## B's diagonal entry of camera-part element i (i < ncC): camera i / C, entry i % C.
<%def name="camera_diagonal_entry()">
<% diag_t = [a * C - a * (a - 1) // 2 for a in range(C)] %>
        const int c = i / ${C}, a = i - c * ${C};
        const int diag[${C}] = {${', '.join(str(t) for t in diag_t)}};
        const acc b_aa = B[(size_t)c * ${C * (C + 1) // 2} + diag[a]];
</%def>
<%def name="column_norm2()">
    acc col2;
    if (i < ncC) {
%if COPIES:
        col2 = cd[i];
%else:
${camera_diagonal_entry()}
        col2 = b_aa;
%endif
    } else {
        const int j = i - ncC, p = j / ${P}, a = j - p * ${P};
        col2 = V[(size_t)p * ${P * P} + a * ${P + 1}];
    }
</%def>

<%
    cd_arg = '__global const real *restrict cd, ' if COPIES else ''
    count_arg = '__global const uchar *restrict count_c, ' if COPIES else ''
    # A camera entry's weight in the norms: 1, or 0 for all but one copy of a column.
    weight = '(i < ncC ? (acc)count_c[i] : 1.0) * ' if COPIES else ''
%>
%if COPIES:
// The camera part's column norms: B's diagonal (summed over the copies by the caller).
__kernel void camera_diagonal(__global const real *restrict B, __global real *restrict cd, const int ncC)
{
    const int i = get_global_id(0);
    if (i >= ncC) return;
${camera_diagonal_entry()}
    cd[i] = b_aa;
}

%endif
__kernel void jacobi_scale(${cd_arg}__global const real *restrict B, __global const real *restrict V,
                           ${vec_args('s', False)}, const int ncC, const int total, const int enabled)
{
    const int i = get_global_id(0);
    if (i >= total) return;
${column_norm2()}
    const acc s = enabled ? 1.0 / (1.0 + sqrt(col2)) : 1.0;
    ${put('s', 's')}
}

#endif
#if LM_PARTS & 2

__kernel void lm_diagonal(${cd_arg}__global const real *restrict B, __global const real *restrict V,
                          ${vec_args('s')}, ${vec_args('diag', False)},
                          const int ncC, const int total, const acc lo, const acc hi)
{
    const int i = get_global_id(0);
    if (i >= total) return;
${column_norm2()}
    const acc s = ${at('s')};
    const acc d = fmin(fmax(col2 * s * s, lo), hi);
    ${put('diag', 'd')}
}

// D = sqrt(diag / radius) in the scaled variables is D / s in the unscaled ones.
acc regularizer(const acc diag, const acc s, const acc radius)
{
    const acc d = sqrt(diag / radius) / s;
    return d * d;
}

__kernel void camera_regularize(${count_arg}__global const real *restrict diag_c, __global const real *restrict s_c,
                                __global real *restrict dc2, const acc radius, const int ncC)
{
    const int i = get_global_id(0);
    if (i >= ncC) return;
%if COPIES:
    // On one copy of each column only: the keys' matrix is summed over the copies.
    dc2[i] = count_c[i] ? regularizer(diag_c[i], s_c[i], radius) : 0.0;
%else:
    dc2[i] = regularizer(diag_c[i], s_c[i], radius);
%endif
}

## inverse(K, M, out): the inverse of the symmetric positive definite K x K matrix M (private,
## row-major) by Cholesky, M = L L^T, inverse = L^-T L^-1 (what solvers/ba/schur.py does with numpy).
## Sets ok = 0 when a pivot is not positive.
<%def name="cholesky_inverse(K, M, out)">
    {
        acc Lm[${K * K}], Li[${K * K}];
        for (int j = 0; j < ${K}; ++j) {
            for (int i = j; i < ${K}; ++i) {
                acc v = ${M}[i * ${K} + j];
                for (int k = 0; k < j; ++k) v -= Lm[i * ${K} + k] * Lm[j * ${K} + k];
                if (i == j) {
                    if (!(v > 0.0) || !isfinite(v)) ok = 0;
                    Lm[j * ${K} + j] = sqrt(v);
                } else {
                    Lm[i * ${K} + j] = v / Lm[j * ${K} + j];
                }
            }
        }
        // Li = L^-1, lower triangular, by forward substitution on the unit vectors.
        for (int j = 0; j < ${K}; ++j)
            for (int i = 0; i < ${K}; ++i) {
                if (i < j) { Li[i * ${K} + j] = 0.0; continue; }
                acc v = (i == j) ? 1.0 : 0.0;
                for (int k = j; k < i; ++k) v -= Lm[i * ${K} + k] * Li[k * ${K} + j];
                Li[i * ${K} + j] = v / Lm[i * ${K} + i];
            }
        for (int i = 0; i < ${K}; ++i)
            for (int j = 0; j < ${K}; ++j) {
                acc v = 0.0;
                for (int k = (i > j ? i : j); k < ${K}; ++k) v += Li[k * ${K} + i] * Li[k * ${K} + j];
                ${out}[i * ${K} + j] = v;
            }
    }
</%def>

__kernel void point_regularize(__global const real *restrict V,       // (npt, P, P)
                               __global const real *restrict diag_p,  // (npt * P)
                               __global const real *restrict s_p,
                               __global real *restrict Vinv,          // (npt, P, P)
                               const acc radius, const int npt)
{
    const int p = get_global_id(0);
    if (p >= npt) return;
    __global const real *Vp = V + (size_t)p * ${P * P};
    acc m[${P * P}];
    for (int j = 0; j < ${P * P}; ++j) m[j] = Vp[j];
    for (int a = 0; a < ${P}; ++a)
        m[a * ${P + 1}] += regularizer(diag_p[p * ${P} + a], s_p[p * ${P} + a], radius);
    __global real *out = Vinv + (size_t)p * ${P * P};
%if P == 3:
    // Cofactors, as solvers/ba/schur.py's inv3_sym (a singular block gives inf/NaN, a failed step).
    const acc a = m[0], b = m[1], c = m[2], d = m[4], e = m[5], f = m[8];
    const acc A = d * f - e * e, Bc = c * e - b * f, Cc = b * e - c * d;
    const acc inv_det = 1.0 / (a * A + b * Bc + c * Cc);
    out[0] = A * inv_det;
    out[1] = out[3] = Bc * inv_det;
    out[2] = out[6] = Cc * inv_det;
    out[4] = (a * f - c * c) * inv_det;
    out[5] = out[7] = (b * c - a * e) * inv_det;
    out[8] = (a * d - b * b) * inv_det;
%else:
    int ok = 1;
    acc inv[${P * P}];
${cholesky_inverse(P, 'm', 'inv')}
    for (int j = 0; j < ${P * P}; ++j) out[j] = ok ? inv[j] : NAN;
%endif
}

#endif
#if LM_PARTS & 4
// The Schur-Jacobi preconditioner per camera: the inverse of B + Dc^2 - (its runs' sums of
// G V^-1 G^T, from schur_pcg_device's jacobi_blocks). A block that is not positive definite is written
// as it is, with failed[c] = 1: the host then inverts every block by a pseudo-inverse, as
// solvers/ba/schur.py does when numpy's Cholesky fails.
__kernel void schur_jacobi(__global const real *restrict B,        // (nc, T)
                           __global const real *restrict dc2,      // (nc * C)
                           __global const acc *restrict blocks,   // (nseg, T)
                           __global const int *restrict cam_seg,     // (nc + 1)
                           __global real *restrict Pinv,           // (nc, C, C)
                           __global int *restrict failed,            // (nc)
                           const int nc)
{
    const int c = get_global_id(0);
    if (c >= nc) return;
    acc m[${C * C}];
<%
    # Each camera entry's parameter block: Ceres' SCHUR_JACOBI inverts the diagonal block of each
    # parameter block, so a merged camera's blocks are inverted apart (no coupling between them).
    part = [k for k, size in enumerate(BLOCKS) for _ in range(size)]
%>
    // One loop over the upper triangle, kept a loop (unroll 1), not an unrolled statement per
    // entry: NVIDIA's compiler took 1.35-1.4 s for the unrolled form and 0.64-0.67 s for this
    // one (one parameter block, H200), the slowest program of a cold solve, and the kernel is no
    // slower (0.14 ms against 0.16 ms for 20,000 cameras; the same bits).
%if len(BLOCKS) > 1:
    const int part[${C}] = {${', '.join(str(v) for v in part)}};
%endif
    #pragma unroll 1
    for (int a = 0, t = 0; a < ${C}; ++a)
        for (int b = a; b < ${C}; ++b, ++t) {
%if len(BLOCKS) > 1:
            if (part[a] != part[b]) { m[a * ${C} + b] = m[b * ${C} + a] = 0; continue; }
%endif
            acc v = B[(size_t)c * ${T} + t];
            for (int s = cam_seg[c]; s < cam_seg[c + 1]; ++s) v -= blocks[(size_t)s * ${T} + t];
            if (a == b) v += dc2[(size_t)c * ${C} + a];
            m[a * ${C} + b] = v;
            m[b * ${C} + a] = v;
        }
    int ok = 1;
    acc inv[${C * C}];
${cholesky_inverse(C, 'm', 'inv')}
    __global real *out = Pinv + (size_t)c * ${C * C};
    for (int j = 0; j < ${C * C}; ++j) out[j] = ok ? inv[j] : m[j];
    failed[c] = !ok;
}
#endif
#if LM_PARTS & 2

// The step from the linear solution: y = raw / s (the scaled variables), step = -y, delta = step s
// (back in the parameters' units, rounded as the host path rounds), candidate = x + delta.
__kernel void make_step(${vec_args('raw')}, ${vec_args('s')}, ${vec_args('x')},
                        ${vec_args('delta', False)}, ${vec_args('cand', False)},
                        const int ncC, const int total)
{
    const int i = get_global_id(0);
    if (i >= total) return;
    const acc y = ${at('raw')} / ${at('s')};
    const acc d = -y * ${at('s')};
    ${put('delta', 'd')}
    const acc xc = ${at('x')} + d;
    ${put('cand', 'xc')}
}

// m . (r + m / 2) per observation with m = Jc dc + Jp dp: the model cost change's terms.
__kernel void model_change(__global const real *restrict Jc, __global const real *restrict Jp,
                           __global const real *restrict r,
                           __global const int *restrict cam, __global const int *restrict pt,
                           __global const real *restrict dc, __global const real *restrict dp,
                           __global acc *restrict value, const int n)
{
    const int o = get_global_id(0);
    if (o >= n) return;
    __global const real *f = Jc + (size_t)o * ${R * C};
    __global const real *e = Jp + (size_t)o * ${R * P};
    __global const real *x = dc + (size_t)cam[o] * ${C};
    __global const real *y = dp + (size_t)pt[o] * ${P};
    acc sum = 0.0;
%for k in range(R):
    {
        const acc m = (${' + '.join(f'(acc)f[{k * C + j}] * x[{j}]' for j in range(C))})
                       + (${' + '.join(f'(acc)e[{k * P + j}] * y[{j}]' for j in range(P))});
        sum += m * (r[(size_t)o * ${R} + ${k}] + m / 2.0);
    }
%endfor
    value[o] = sum;
}

## Two-stage reductions. Stage 1: G work-groups of L items; item g*L+l folds elements
## g*L+l, + G*L, ... into two accumulators (sum, and sum or max), then the group folds its items.
## Stage 2 (finish): one group folds the G partial pairs into scalars[slot], scalars[slot + 1].
## Always the same shape for a given length, so the same order of operations every run.
<%def name="group_fold(acc0, acc1, second)">
<%
    # how the second accumulators combine: 'sum', 'max', or chosen at run time by second_max
    combine = {'sum': lambda x, y: f'{x} + {y}', 'max': lambda x, y: f'fmax({x}, {y})',
               'runtime': lambda x, y: f'second_max ? fmax({x}, {y}) : {x} + {y}'}[second]
%>
    __local acc buf0[${L}], buf1[${L}];
    const int lid = get_local_id(0);
    buf0[lid] = ${acc0};
    buf1[lid] = ${acc1};
    barrier(CLK_LOCAL_MEM_FENCE);
%for h in [L >> k for k in range(1, L.bit_length())]:
    if (lid < ${h}) {
        buf0[lid] += buf0[lid + ${h}];
        buf1[lid] = ${combine('buf1[lid]', f'buf1[lid + {h}]')};
    }
    barrier(CLK_LOCAL_MEM_FENCE);
%endfor
</%def>
<%def name="reduction(name, args, body, second='sum')">
__kernel __attribute__((reqd_work_group_size(${L}, 1, 1)))
void ${name}(${args}, const int total, __global acc *restrict partial)
{
    acc acc0 = 0.0, acc1 = 0.0;
    for (int i = get_global_id(0); i < total; i += get_global_size(0)) {
${body}
    }
${group_fold('acc0', 'acc1', second)}
    if (lid == 0) {
        partial[2 * get_group_id(0)] = buf0[0];
        partial[2 * get_group_id(0) + 1] = buf1[0];
    }
}
</%def>
${reduction('reduce_sum', '__global const acc *restrict value', '        acc0 += value[i];')}
## |x - Plus(x, -g)| as Ceres measures the gradient: max and squared 2-norm.
## (With COPIES, the sums count one copy of each camera column; the copies hold equal values.)
${reduction('reduce_gradient', count_arg + vec_args('x') + ', ' + vec_args('g') + ', const int ncC',
            '        const acc x = ' + at('x') + ';\n        const acc v = x - (x + (-' + at('g') + '));\n'
            '        acc0 += ' + weight + 'v * v;\n        acc1 = fmax(acc1, fabs(v));', second='max')}
## |x - candidate|^2 and how many entries of the raw linear solution are not finite.
${reduction('reduce_step', count_arg + vec_args('x') + ', ' + vec_args('cand') + ', ' + vec_args('raw') + ', const int ncC',
            '        const acc v = ' + at('x') + ' - ' + at('cand') + ';\n        acc0 += ' + weight + 'v * v;\n'
            '        acc1 += isfinite(' + at('raw') + ') ? 0.0 : 1.0;')}
## |x|^2
${reduction('reduce_norm', count_arg + vec_args('x') + ', const int ncC',
            '        const acc v = ' + at('x') + ';\n        acc0 += ' + weight + 'v * v;')}

__kernel __attribute__((reqd_work_group_size(${L}, 1, 1)))
void finish(__global const acc *restrict partial, const int groups, const int second_max,
            __global acc *restrict scalars, const int slot)
{
    acc acc0 = 0.0, acc1 = 0.0;
    for (int g = get_local_id(0); g < groups; g += ${L}) {
        acc0 += partial[2 * g];
        acc1 = second_max ? fmax(acc1, partial[2 * g + 1]) : acc1 + partial[2 * g + 1];
    }
${group_fold('acc0', 'acc1', 'runtime')}
    if (lid == 0) {
        scalars[slot] = buf0[0];
        scalars[slot + 1] = buf1[0];
    }
}
#endif
