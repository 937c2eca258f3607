## Preconditioned conjugate gradients on the implicit Schur complement, entirely on the device
## (iterative_schur). One CG iteration is five launches (six on GPUs) and no transfer:
##
##   project_points   per point p:   t_o = F_o v (or the residual f_o), u = sum_o E_o^T t_o,
##                                   w_o = t_o - E_o V_p^-1 u     for the observations o of p
##                                   (on GPUs t = F v is camera_rows', per observation row)
##   camera_partials  per run of one camera's observations (camera order): sum F_o^T w_o
##   cg_product       per camera entry: q = S p = (its runs' partials) + Dc^2 p, p'q per work-group
##   cg_advance       per camera: alpha = rho / p'q, x += alpha p, r -= alpha q (or r = b - S x at a
##                    residual reset), z = M r, and per work-group r'z, x'(b + r), r'r
##   cg_direction     per camera: Ceres' termination tests, rho, beta, p = z + beta p; work-item 0
##                    writes the CG state
##
## so S v = F^T (I - E V^-1 E^T) F v + Dc^2 v without forming S. The dot products are two-stage:
## every work-group of the next kernel adds the per-group partials itself, in the same fixed order,
## so all of them take the same decisions on bitwise equal scalars, and the sums run in the same
## order on every run. The CG state (termination status, rho, ...) is double-buffered: iteration i
## reads state[i % 2] and cg_direction writes state[(i + 1) % 2], so no kernel reads a state that a
## work-group of the same launch writes.
##
## Per linear system also jacobi_blocks (the preconditioner's blocks of S, less B + Dc^2) and,
## after the solve, back_substitute (the points' step). camera_sums serves a solve split over
## parts: their per-camera shares of a product, which the host sums and the CG kernels read back
## as one run per camera. The host enqueues iterations ahead and reads the small state now and
## then: every kernel returns at once when the state says the solve has ended, so iterations
## enqueued past the end cost only their launches.
## Observations are sorted by point; Jacobian blocks are as the model returns them, F (n, R, C) and
## E (n, R, P), row-major.
## Parameters: C, P, R (camera, point and residual block sizes, from the model); REAL (storage
## type) and ACC (the type of sums and of the CG state: double where the device has it); L (the
## work-group size of the cg_* kernels, a power of two); STAGED (whether project_points_split
## stages each work-group of LP points' observations in local memory, as many as its `cap`
## argument says; LP is also camera_rows' work-group of rows).
## Both layouts of the products are in every program, chosen per solve by its size, never a
## render parameter (a new size builds nothing): the fused one (project_points computes F v itself,
## camera_partials has one work-item per run) and the split one of GPUs (camera_rows first, then
## project_points_split, and camera_partials_split with one work-item per run and camera
## parameter on a camera-ordered copy of F that camera_order_blocks makes per Jacobian, so that
## neighbouring work-items read neighbouring memory).
<%namespace name="common" file="/clkernels/common.cl.mako"/>
${common.fp64_pragma()}
// No fused multiply-adds: the host reference (numpy) rounds every product, and CG's termination
// on an ill-conditioned system follows the rounding closely enough for fusing to change it.
#pragma OPENCL FP_CONTRACT OFF
<%
    T = C * (C + 1) // 2
    tri = [(a, b) for a in range(C) for b in range(a, C)]
%>
typedef ${REAL} real;
typedef ${ACC} acc;
## camera_row(j): row j of the observation's camera block F_o (at f) times the camera vector at x
<%def name="camera_row(row)">${' + '.join(f'(acc)f[{C * row + k}] * x[{k}]' for k in range(C))}</%def>
## project_points' two halves, the same in every layout: u += E_o^T t_o (t_at(j): row j of
## observation o's t), and after the loop v = V_p^-1 u with w_o = t_o - E_o v (t_buf: where t is,
## w_buf: where w goes). E rows are read from E_base in address space `space` (global memory, or
## the staged copy in local memory), so every layout does the same arithmetic in the same order.
<%def name="accumulate_u(t_at, space='__global', E_base='Jp')">
        ${space} const real *E = ${E_base} + (size_t)o * ${R * P};
%for k in range(P):
        u${k} += ${' + '.join(f'(acc)E[{P * j + k}] * {t_at(j)}' for j in range(R))};
%endfor
</%def>
<%def name="subtract_projection(t_buf, w_buf='w', space='__global', E_base='Jp')">
    __global const real *M = Vinv + (size_t)p * ${P * P};
%for k in range(P):
    const acc v${k} = ${' + '.join(f'M[{P * k + i}] * u{i}' for i in range(P))};
%endfor
    for (int o = s; o < e; ++o) {
        ${space} const real *E = ${E_base} + (size_t)o * ${R * P};
%for j in range(R):
        ${w_buf}[${R} * o + ${j}] = ${t_buf}[${R} * o + ${j}] - (${' + '.join(f'E[{P * j + k}] * v{k}' for k in range(P))});
%endfor
    }
</%def>
## Point p's whole projection, its observations s .. e - 1 of t_buf (the GPU layout).
<%def name="project_point(t_buf, w_buf='w', space='__global', E_base='Jp')">
%for k in range(P):
    acc u${k} = 0.0;
%endfor
    for (int o = s; o < e; ++o) {
${accumulate_u(lambda j: f'{t_buf}[{R} * o + {j}]', space, E_base)}
    }
${subtract_projection(t_buf, w_buf, space, E_base)}
</%def>

// state[]: what the host reads back (kept in step with schur_pcg_device.py)
#define S_STATUS 0   // RUNNING or how the solve ended
#define S_ITER   1   // iterations at the end
#define S_RHO    2   // r'z of the current iteration
#define S_Q0     3   // the quadratic model at the previous iteration
#define S_TOL_R  4   // r_tolerance |b|
#define S_VALUE  5   // the value a termination message quotes
#define S_IT     6   // the iteration that reads this state (0: the start)
#define N_STATE  8
#define RUNNING       0.0
#define B_ZERO        1.0
#define R_SMALL       2.0
#define ZETA          3.0
#define MAX_ITER      4.0
#define INDEFINITE    5.0
#define FAIL_RHO     -1.0
#define FAIL_BETA    -2.0
#define FAIL_ALPHA   -3.0
// cg_advance modes
#define STEP          1   // x += alpha p, r -= alpha q, z = M r
#define STEP_NO_R     2   // x += alpha p only (a residual reset follows)
#define RESET         3   // r = b - S x (S x from the partials of x), z = M r

// GPUs: t = F v one work-item per observation row, each work-group of ${LP} rows first copying
// its rows of F into local memory side by side (one row per work-item read straight from global
// memory is ${C} reals apart from its neighbour's, which GPUs' loads serve poorly); then
// project_points per point from t. The fused kernel below reads F one point's rows per
// work-item, further apart still.
__kernel __attribute__((reqd_work_group_size(${LP}, 1, 1)))
void camera_rows(__global const real *restrict Jc,      // (n, R, C)
                 __global const int *restrict cam,      // (n)
                 __global const real *restrict v,       // (nc, C)
                 __global real *restrict t,             // (n, R)
                 __global const acc *restrict state,
                 const int n)
{
    __local real lf[${LP * C}];
    if (state[S_STATUS] != RUNNING) return;         // the same for every work-item
    const int i = get_global_id(0), lid = get_local_id(0);
    const int first = get_group_id(0) * ${LP}, rows = min(${LP}, n * ${R} - first);
    for (int e = lid; e < rows * ${C}; e += ${LP}) lf[e] = Jc[(size_t)first * ${C} + e];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid >= rows) return;
    __local const real *f = lf + lid * ${C};
    __global const real *x = v + (size_t)cam[i / ${R}] * ${C};
    t[i] = ${camera_row(0)};
}

// The GPU layout's copy of F in camera order (Jcc), made once per Jacobian: camera_partials_split
// then reads each run's blocks side by side instead of one observation's blocks far from the next.
__kernel void camera_order_blocks(__global const real *restrict Jc,    // (n, R, C) in point order
                                  __global const int *restrict obs,    // (n) in camera order
                                  __global real *restrict Jcc,         // (n, R, C) in camera order
                                  const int n)
{
    const int i = get_global_id(0), k = i / ${R * C};
    if (k >= n) return;
    Jcc[i] = Jc[(size_t)obs[k] * ${R * C} + (i - k * ${R * C})];
}

%if STAGED:
// A work-group's ${LP} points have contiguous observations (sorted by point): the group copies
// their t and E rows into local memory side by side (coalesced), each work-item then works on
// its own point there, w replaces t in place, and the group writes w back side by side. Read
// one point's rows per work-item straight from global memory, neighbouring work-items are
// observations apart and a GPU's loads serve them poorly. A group whose points have more than
// `cap` observations reads them directly (the same arithmetic, so the same bits). The local
// buffers are arguments, sized per solve: less local memory leaves room for more work-groups at
// once, more serves problems whose groups would overflow it (H200, float64: a final-size solve,
// about 416 observations per group, took 0.16 s with room for 512 and 0.46 s with 375; at venice
// size, about 324, 375 was 12% faster).
__kernel __attribute__((reqd_work_group_size(${LP}, 1, 1)))
void project_points_split(__global const real *restrict Jp,      // (n, R, P)
                          __global const int *restrict pt_start, // (npt + 1)
                          __global const real *restrict Vinv,    // (npt, P, P)
                          __global const real *restrict t,       // (n, R): F v, or f
                          __global real *restrict w,             // (n, R)
                          __global const acc *restrict state,
                          const int npt,
                          __local real *restrict lt,             // (cap, R)
                          __local real *restrict lE,             // (cap, R, P)
                          const int cap)
{
    if (state[S_STATUS] != RUNNING) return;         // the same for every work-item
    const int p = get_global_id(0), lid = get_local_id(0);
    const int p0 = get_group_id(0) * ${LP}, p1 = min(p0 + ${LP}, npt);
    const int s0 = pt_start[p0], count = pt_start[p1] - s0;
    if (count > cap) {                              // the whole group: no barrier waits
        if (p >= npt) return;
        const int s = pt_start[p], e = pt_start[p + 1];
${project_point('t')}
        return;
    }
    for (int i = lid; i < count * ${R}; i += ${LP}) lt[i] = t[(size_t)s0 * ${R} + i];
    for (int i = lid; i < count * ${R * P}; i += ${LP}) lE[i] = Jp[(size_t)s0 * ${R * P} + i];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (p < npt) {                                  // w replaces t in place
        const int s = pt_start[p] - s0, e = pt_start[p + 1] - s0;
${project_point('lt', 'lt', '__local', 'lE')}
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = lid; i < count * ${R}; i += ${LP}) w[(size_t)s0 * ${R} + i] = lt[i];
}
%else:
__kernel void project_points_split(__global const real *restrict Jp,      // (n, R, P)
                                   __global const int *restrict pt_start, // (npt + 1)
                                   __global const real *restrict Vinv,    // (npt, P, P)
                                   __global const real *restrict t,       // (n, R): F v, or f
                                   __global real *restrict w,             // (n, R)
                                   __global const acc *restrict state,
                                   const int npt)
{
    const int p = get_global_id(0);
    if (p >= npt || state[S_STATUS] != RUNNING) return;
    const int s = pt_start[p], e = pt_start[p + 1];
${project_point('t')}
}
%endif
// The fused layout (CPUs, and GPUs below SPLIT_MIN_OBSERVATIONS): F v inside project_points.
__kernel void project_points(__global const real *restrict Jc,      // (n, R, C)
                             __global const real *restrict Jp,      // (n, R, P)
                             __global const int *restrict cam,      // (n)
                             __global const int *restrict pt_start, // (npt + 1)
                             __global const real *restrict Vinv,    // (npt, P, P)
                             __global const real *restrict v,       // (nc, C) or f (n, R)
                             __global real *restrict w,             // (n, R)
                             __global const acc *restrict state,
                             const int npt, const int from_residuals)
{
    const int p = get_global_id(0);
    if (p >= npt || state[S_STATUS] != RUNNING) return;
    const int s = pt_start[p], e = pt_start[p + 1];
%for k in range(P):
    acc u${k} = 0.0;
%endfor
    for (int o = s; o < e; ++o) {
%for j in range(R):
        acc t${j};
%endfor
        if (from_residuals) {
%for j in range(R):
            t${j} = v[${R} * o + ${j}];
%endfor
        } else {
            __global const real *f = Jc + (size_t)o * ${R * C};
            __global const real *x = v + (size_t)cam[o] * ${C};
%for j in range(R):
            t${j} = ${camera_row(j)};
%endfor
        }
%for j in range(R):
        w[${R} * o + ${j}] = t${j};
%endfor
${accumulate_u(lambda j: f't{j}')}
    }
${subtract_projection('w')}
}


// One work-item per (run, camera parameter a), on the camera-ordered copy of F: the work-items of
// one run read one observation's F_o row entries side by side, and the run's observations follow
// each other there. The same products summed in the same order as camera_partials.
__kernel void camera_partials_split(__global const real *restrict Jcc,     // (n, R, C) in camera order
                                    __global const real *restrict w,       // (n, R)
                                    __global const int *restrict obs,      // (n) in camera order
                                    __global const int *restrict seg_start,// (nseg + 1)
                                    __global acc *restrict partial,        // (nseg, C)
                                    __global const acc *restrict state,
                                    const int nseg)
{
    const int gid = get_global_id(0), s = gid / ${C}, a = gid - s * ${C};
    if (s >= nseg || state[S_STATUS] != RUNNING) return;
    acc sum = 0.0;
    const int end = seg_start[s + 1];
    for (int k = seg_start[s]; k < end; ++k) {
        const int o = obs[k];
        __global const real *f = Jcc + (size_t)k * ${R * C} + a;
        sum += ${' + '.join(f'f[{C * j}] * w[{R} * o + {j}]' for j in range(R))};
    }
    partial[gid] = sum;
}
// The fused layout: one work-item per run, all C parameters.
__kernel void camera_partials(__global const real *restrict Jc,      // (n, R, C)
                              __global const real *restrict w,       // (n, R)
                              __global const int *restrict obs,      // (n) in camera order
                              __global const int *restrict seg_start,// (nseg + 1)
                              __global acc *restrict partial,        // (nseg, C)
                              __global const acc *restrict state,
                              const int nseg)
{
    const int s = get_global_id(0);
    if (s >= nseg || state[S_STATUS] != RUNNING) return;
%for a in range(C):
    acc acc${a} = 0.0;
%endfor
    const int end = seg_start[s + 1];
    for (int k = seg_start[s]; k < end; ++k) {
        const int o = obs[k];
        __global const real *f = Jc + (size_t)o * ${R * C};
%for j in range(R):
        const acc w${j} = w[${R} * o + ${j}];
%endfor
%for a in range(C):
        acc${a} += ${' + '.join(f'f[{C * j + a}] * w{j}' for j in range(R))};
%endfor
    }
%for a in range(C):
    partial[(size_t)s * ${C} + ${a}] = acc${a};
%endfor
}

// Per run of one camera's observations (camera order, point order within a camera; runs never
// split one camera-point group): the upper triangle (T entries, row-major) of
//   sum over the camera's points p of G_p V_p^-1 G_p^T,  G_p = sum over its observations of p of W_o,
// W_o = F_o^T E_o (C x P). That is the pairs' sum of S's diagonal block for this camera, a point
// seen twice by one camera included: sum over o1, o2 of W_o1 V^-1 W_o2^T = G V^-1 G^T.
__kernel void jacobi_blocks(__global const real *restrict Jc,      // (n, R, C)
                            __global const real *restrict Jp,      // (n, R, P)
                            __global const int *restrict obs,      // (n) in camera order
                            __global const int *restrict pt,       // (n)
                            __global const int *restrict seg_start,// (nseg + 1)
                            __global const real *restrict Vinv,    // (npt, P, P)
                            __global acc *restrict out,            // (nseg, T)
                            const int nseg)
{
    const int s = get_global_id(0);
    if (s >= nseg) return;
%for a, b in tri:
    acc acc${a}_${b} = 0.0;
%endfor
    const int end = seg_start[s + 1];
    int k = seg_start[s];
    while (k < end) {
        const int p = pt[obs[k]];
%for a in range(C):
%for j in range(P):
        acc g${a}_${j} = 0.0;
%endfor
%endfor
        for (; k < end && pt[obs[k]] == p; ++k) {
            __global const real *f = Jc + (size_t)obs[k] * ${R * C};
            __global const real *e = Jp + (size_t)obs[k] * ${R * P};
%for a in range(C):
%for j in range(P):
            g${a}_${j} += ${' + '.join(f'f[{C * r + a}] * e[{P * r + j}]' for r in range(R))};
%endfor
%endfor
        }
        __global const real *M = Vinv + (size_t)p * ${P * P};
%for j in range(P):
%for i in range(P):
        const acc m${j}${i} = M[${P * j + i}];
%endfor
%endfor
%for a in range(C):
%for i in range(P):
        const acc z${a}_${i} = ${' + '.join(f'g{a}_{j} * m{j}{i}' for j in range(P))};
%endfor
%endfor
%for a, b in tri:
        acc${a}_${b} += ${' + '.join(f'z{a}_{i} * g{b}_{i}' for i in range(P))};
%endfor
    }
%for t, (a, b) in enumerate(tri):
    out[(size_t)s * ${T} + ${t}] = acc${a}_${b};
%endfor
}

// The points' step after the cameras' (y_c): y_p = V_p^-1 (g_p - sum over the observations of p
// of E_o^T F_o y_c).
__kernel void back_substitute(__global const real *restrict Jc,     // (n, R, C)
                              __global const real *restrict Jp,     // (n, R, P)
                              __global const int *restrict cam,     // (n)
                              __global const int *restrict pt_start,// (npt + 1)
                              __global const real *restrict Vinv,   // (npt, P, P)
                              __global const real *restrict gp,     // (npt, P)
                              __global const real *restrict yc,     // (nc, C)
                              __global real *restrict yp,           // (npt, P)
                              const int npt)
{
    const int p = get_global_id(0);
    if (p >= npt) return;
%for k in range(P):
    acc u${k} = gp[${P} * p + ${k}];
%endfor
    for (int o = pt_start[p]; o < pt_start[p + 1]; ++o) {
        __global const real *f = Jc + (size_t)o * ${R * C};
        __global const real *x = yc + (size_t)cam[o] * ${C};
%for j in range(R):
        const acc t${j} = ${camera_row(j)};
%endfor
        __global const real *E = Jp + (size_t)o * ${R * P};
%for k in range(P):
        u${k} -= ${' + '.join(f'E[{P * j + k}] * t{j}' for j in range(R))};
%endfor
    }
    __global const real *M = Vinv + (size_t)p * ${P * P};
%for k in range(P):
    yp[${P} * p + ${k}] = ${' + '.join(f'M[{P * k + i}] * u{i}' for i in range(P))};
%endfor
}

// Per camera, the sum of its runs' rows (``width`` values each: camera_partials' C, or
// jacobi_blocks' T): a part's camera-sized share of a product or of the preconditioner's blocks,
// which a solve split over parts sums across them (solvers.split.partitioned_device).
__kernel void camera_sums(__global const acc *restrict rows,     // (nseg, width)
                          __global const int *restrict cam_seg,  // (nc + 1)
                          __global acc *restrict out,            // (nc, width)
                          const int nc, const int width)
{
    const int i = get_global_id(0), c = i / width, a = i - c * width;
    if (c >= nc) return;
    acc v = 0.0;
    for (int s = cam_seg[c]; s < cam_seg[c + 1]; ++s) v += rows[(size_t)s * width + a];
    out[i] = v;
}

// ------------------------------------------------------------------ the CG's vector kernels
// One work-item per camera (its C entries of every vector), L per work-group.

// Sum of `count` values per work-item over the work-group (buf holds count * L values); every
// work-item gets the same sums. Called unconditionally (with zeros where there is nothing to
// sum): PoCL's CPU compiler needs every barrier on a path all work-items provably take.
void group_sums(__local acc *buf, acc *v, const int count)
{
    const int lid = get_local_id(0);
    for (int j = 0; j < count; ++j) buf[j * ${L} + lid] = v[j];
    barrier(CLK_LOCAL_MEM_FENCE);
%for h in [L >> k for k in range(1, L.bit_length())]:
    if (lid < ${h})
        for (int j = 0; j < count; ++j) buf[j * ${L} + lid] += buf[j * ${L} + lid + ${h}];
    barrier(CLK_LOCAL_MEM_FENCE);
%endfor
    for (int j = 0; j < count; ++j) v[j] = buf[j * ${L}];
    barrier(CLK_LOCAL_MEM_FENCE);   // buf may be reused at once
}

// The totals of `count` per-group partials (dots holds G rows of `stride`), the same in every
// work-group: each adds the G rows in the same order.
void dot_totals(__global const acc *dots, const int G, const int stride, const int count,
                __local acc *buf, acc *out)
{
    for (int j = 0; j < count; ++j) out[j] = 0.0;
    for (int g = get_local_id(0); g < G; g += ${L})
        for (int j = 0; j < count; ++j) out[j] += dots[g * stride + j];
    group_sums(buf, out, count);
}

// A work-group's partial sums, written by its first work-item.
void write_partials(__local acc *buf, acc *v, const int count, __global acc *dots)
{
    group_sums(buf, v, count);
    if (get_local_id(0) == 0)
        for (int j = 0; j < count; ++j) dots[get_group_id(0) * count + j] = v[j];
}

// (S v)_c for camera c: its runs' partial sums of F^T w plus Dc^2 v.
void camera_product(__global const acc *partial, __global const int *cam_seg,
                    __global const real *dc2, __global const real *v, const int c, acc *out)
{
    for (int a = 0; a < ${C}; ++a) out[a] = (acc)dc2[${C} * c + a] * v[${C} * c + a];
    for (int s = cam_seg[c]; s < cam_seg[c + 1]; ++s)
        for (int a = 0; a < ${C}; ++a) out[a] += partial[(size_t)s * ${C} + a];
}

// z = M r for camera c, and its terms of r'z, x'(b + r) and r'r.
void precondition(__global const real *Pinv, __global const real *b, __global const real *x,
                  __global const real *r, __global real *z, const int c, acc *d)
{
    __global const real *M = Pinv + (size_t)c * ${C * C};
    for (int a = 0; a < ${C}; ++a) {
        const int i = ${C} * c + a;
        acc s = 0.0;
        for (int k = 0; k < ${C}; ++k) s += (acc)M[${C} * a + k] * r[${C} * c + k];
        z[i] = s;
        d[0] += r[i] * s;
        d[1] += x[i] * ((acc)b[i] + r[i]);
        d[2] += (acc)r[i] * r[i];
    }
}

// The start: b = r = F^T (f - E V^-1 E^T f) (the cameras' runs), x = 0, z = M r; per group
// r'z and b'b.
__kernel __attribute__((reqd_work_group_size(${L}, 1, 1)))
void cg_start(__global const acc *restrict partial, __global const int *restrict cam_seg,
              __global const real *restrict Pinv,
              __global real *restrict b, __global real *restrict x, __global real *restrict r,
              __global real *restrict z, __global acc *restrict dots, const int nc)
{
    __local acc buf[3 * ${L}];
    const int c = get_global_id(0);
    acc d[3] = {0.0, 0.0, 0.0};
    if (c < nc) {
        acc Sv[${C}];
        for (int a = 0; a < ${C}; ++a) Sv[a] = 0.0;
        for (int g = cam_seg[c]; g < cam_seg[c + 1]; ++g)
            for (int a = 0; a < ${C}; ++a) Sv[a] += partial[(size_t)g * ${C} + a];
        for (int a = 0; a < ${C}; ++a) {
            const int i = ${C} * c + a;
            b[i] = Sv[a]; r[i] = Sv[a]; x[i] = 0.0;
        }
        precondition(Pinv, b, x, r, z, c, d);
        d[1] = 0.0;
        for (int a = 0; a < ${C}; ++a) d[1] += (acc)b[${C} * c + a] * b[${C} * c + a];
        d[2] = 0.0;
    }
    write_partials(buf, d, 3, dots);
}

// q = S p, one work-item per camera entry (neighbours read neighbouring partials), and the
// groups' p'q.
__kernel __attribute__((reqd_work_group_size(${L}, 1, 1)))
void cg_product(__global const acc *restrict partial, __global const int *restrict cam_seg,
                __global const real *restrict dc2, __global const real *restrict p,
                __global real *restrict q, __global acc *restrict dots_pq,
                __global const acc *restrict state, const int nc)
{
    __local acc buf[${L}];
    const int i = get_global_id(0), c = i / ${C}, a = i - c * ${C};
    acc pq = 0.0;
    if (c < nc && state[S_STATUS] == RUNNING) {
        acc v = (acc)dc2[i] * p[i];
        for (int s = cam_seg[c]; s < cam_seg[c + 1]; ++s) v += partial[(size_t)s * ${C} + a];
        q[i] = v;
        pq = p[i] * v;
    }
    write_partials(buf, &pq, 1, dots_pq);
}

// alpha = rho / p'q unless the iteration fails there (cg_direction says how), then the mode's
// updates of x and r, z = M r and the groups' r'z, x'(b + r), r'r.
__kernel __attribute__((reqd_work_group_size(${L}, 1, 1)))
void cg_advance(__global const acc *restrict partial, __global const int *restrict cam_seg,
                __global const real *restrict dc2, __global const real *restrict Pinv,
                __global const real *restrict b, __global real *restrict x, __global real *restrict r,
                __global const real *restrict p, __global real *restrict z,
                __global const real *restrict q, __global const acc *restrict dots_pq,
                __global acc *restrict dots, __global const acc *restrict state,
                const int nc, const int G_pq, const int mode)
{
    __local acc buf[3 * ${L}];
    const int c = get_global_id(0);
    acc pq;
    dot_totals(dots_pq, G_pq, 1, 1, buf, &pq);
    const acc alpha = state[S_RHO] / pq;
    const int go = state[S_STATUS] == RUNNING && !(pq <= 0.0 || isinf(pq)) && isfinite(alpha);
    acc d[3] = {0.0, 0.0, 0.0};
    if (go && c < nc) {
        if (mode == RESET) {
            acc Sx[${C}];
            camera_product(partial, cam_seg, dc2, x, c, Sx);
            for (int a = 0; a < ${C}; ++a) r[${C} * c + a] = b[${C} * c + a] - Sx[a];
        } else {
            for (int a = 0; a < ${C}; ++a) {
                const int i = ${C} * c + a;
                x[i] += alpha * p[i];
                if (mode == STEP) r[i] -= alpha * q[i];
            }
        }
        if (mode != STEP_NO_R) precondition(Pinv, b, x, r, z, c, d);
    }
    write_partials(buf, d, 3, dots);
}

// The end of an iteration (start: it == 0), the same decisions in every work-group: Ceres' tests
// on p'q and alpha, the quadratic model and the residual, then rho = r'z, beta and
// p = z + beta p (p = z at the start). Work-item 0 writes the next state.
__kernel __attribute__((reqd_work_group_size(${L}, 1, 1)))
void cg_direction(__global const real *restrict z, __global real *restrict p,
                  __global const acc *restrict dots_pq, __global const acc *restrict dots,
                  __global const acc *restrict state, __global acc *restrict next_state,
                  const int nc, const int G, const int G_pq, const int max_iterations,
                  const acc q_tolerance, const acc r_tolerance)
{
    __local acc buf[3 * ${L}];
    const int c = get_global_id(0);
    const acc status0 = state[S_STATUS];
    const int it = (int)state[S_IT], start = it == 0, active = status0 == RUNNING;
    acc rho = state[S_RHO], Q0 = state[S_Q0], tol_r = state[S_TOL_R];
    acc status = status0, value = state[S_VALUE], iter = state[S_ITER];
    int next = active;
    acc pq, d[3];
    dot_totals(dots_pq, G_pq, 1, 1, buf, &pq);
    dot_totals(dots, G, 3, 3, buf, d);           // start: r'z, b'b; else r'z, x'(b + r), r'r
    if (active && start) {
        const acc norm_b = sqrt(d[1]);
        tol_r = r_tolerance * norm_b;
        Q0 = 0.0;                    // -x'(b + r) at x = 0
        rho = 1.0;
        iter = 0.0;
        value = 0.0;
        if (norm_b == 0.0) { status = B_ZERO; next = 0; }
        else if (norm_b <= tol_r) { status = R_SMALL; next = 0; }
    } else if (active) {
        const acc alpha = rho / pq;
        value = 0.0;
        if (pq <= 0.0 || isinf(pq)) { status = INDEFINITE; value = pq; iter = it; next = 0; }
        else if (!isfinite(alpha)) { status = FAIL_ALPHA; value = alpha; iter = it; next = 0; }
        else {
            const acc Q1 = -d[1], zeta = it * (Q1 - Q0) / Q1;
            iter = it;
            if (zeta < q_tolerance) { status = ZETA; value = zeta; next = 0; }
            else {
                Q0 = Q1;
                if (sqrt(d[2]) <= tol_r) { status = R_SMALL; next = 0; }
                else if (it >= max_iterations) { status = MAX_ITER; next = 0; }
            }
        }
    }
    if (next) {
        const acc last_rho = rho;
        rho = d[0];
        iter = it + 1.0;
        const acc beta = rho / last_rho;
        if (rho == 0.0 || !isfinite(rho)) { status = FAIL_RHO; value = rho; }
        else if (!start && (beta == 0.0 || !isfinite(beta))) { status = FAIL_BETA; value = beta; }
        else if (c < nc)
            for (int a = 0; a < ${C}; ++a) {
                const int i = ${C} * c + a;
                p[i] = start ? z[i] : z[i] + beta * p[i];
            }
    }
    if (c == 0) {
        next_state[S_STATUS] = status;
        next_state[S_ITER] = iter;
        next_state[S_RHO] = rho;
        next_state[S_Q0] = Q0;
        next_state[S_TOL_R] = tol_r;
        next_state[S_VALUE] = value;
        next_state[S_IT] = active ? it + 1.0 : it;
        next_state[7] = 0.0;
    }
}
