## Preconditioned conjugate gradients on the implicit Schur complement, entirely on the device
## (iterative_schur). One CG iteration is three launches and no transfer:
##
##   project_points   per point p:   t_o = F_o v (or the residual f_o), u = sum_o E_o^T t_o,
##                                   w_o = t_o - E_o V_p^-1 u     for the observations o of p
##   camera_partials  per segment of one camera's observations (camera order): sum F_o^T w_o
##   cg_update        one work-group: S v = (sum of the camera's partials) + Dc^2 v, then the CG
##                    vector updates, dot products and termination tests of solvers/cg.py
##
## so S v = F^T (I - E V^-1 E^T) F v + Dc^2 v without forming S. Per linear system also
## jacobi_blocks (the preconditioner's blocks of S, less B + Dc^2) and, after the solve,
## back_substitute (the points' step); neither forms W = F^T E or W V^-1 per observation. The host enqueues iterations
## ahead and reads the small state vector now and then: every kernel returns at once when the state
## says the solve has ended, so iterations enqueued past the end cost only their launches.
## Observations are sorted by point; Jacobian blocks are as the model returns them, F (n, 2, 9)
## and E (n, 2, 3), row-major doubles.
## Parameters: L, the work-group size of cg_update (a power of two).
<%namespace name="common" file="/clkernels/common.cl.mako"/>
${common.fp64_pragma()}
## camera_row(j): row j of the observation's camera block F_o (at f) times the camera vector at x
<%def name="camera_row(row)">${' + '.join(f'f[{9 * row + k}] * x[{k}]' for k in range(9))}</%def>

// state[]: what the host reads back (kept in step with schur_pcg.py)
#define S_STATUS 0   // RUNNING or how the solve ended
#define S_ITER   1   // iterations at the end
#define S_RHO    2   // r'z of the current iteration
#define S_Q0     3   // the quadratic model at the previous iteration
#define S_TOL_R  4   // r_tolerance |b|
#define S_VALUE  5   // the value a termination message quotes
#define RUNNING       0.0
#define B_ZERO        1.0
#define R_SMALL       2.0
#define ZETA          3.0
#define MAX_ITER      4.0
#define INDEFINITE    5.0
#define FAIL_RHO     -1.0
#define FAIL_BETA    -2.0
#define FAIL_ALPHA   -3.0
// cg_update modes
#define START         0   // b = F^T (f - E V^-1 E^T f): r = b, x = 0, first z, rho and p
#define STEP          1   // q = S p, alpha, x and r updated, then the next direction
#define STEP_NO_R     2   // as STEP up to x (a residual reset follows)
#define RESET         3   // r = b - S x, then the next direction

__kernel void project_points(__global const double *restrict Jc,      // (n, 2, 9)
                             __global const double *restrict Jp,      // (n, 2, 3)
                             __global const int *restrict cam,        // (n)
                             __global const int *restrict pt_start,   // (npt + 1)
                             __global const double *restrict Vinv,    // (npt, 3, 3)
                             __global const double *restrict v,       // (nc, 9) or f (n, 2)
                             __global double *restrict w,             // (n, 2)
                             __global const double *restrict state,
                             const int npt, const int from_residuals)
{
    const int p = get_global_id(0);
    if (p >= npt || state[S_STATUS] != RUNNING) return;
    const int s = pt_start[p], e = pt_start[p + 1];
    double u0 = 0.0, u1 = 0.0, u2 = 0.0;
    for (int o = s; o < e; ++o) {
        double t0, t1;
        if (from_residuals) {
            t0 = v[2 * o];
            t1 = v[2 * o + 1];
        } else {
            __global const double *f = Jc + (size_t)o * 18;
            __global const double *x = v + (size_t)cam[o] * 9;
            t0 = ${camera_row(0)};
            t1 = ${camera_row(1)};
        }
        w[2 * o] = t0;
        w[2 * o + 1] = t1;
        __global const double *E = Jp + (size_t)o * 6;
%for k in range(3):
        u${k} += E[${k}] * t0 + E[${3 + k}] * t1;
%endfor
    }
    __global const double *M = Vinv + (size_t)p * 9;
%for k in range(3):
    const double v${k} = M[${3 * k}] * u0 + M[${3 * k + 1}] * u1 + M[${3 * k + 2}] * u2;
%endfor
    for (int o = s; o < e; ++o) {
        __global const double *E = Jp + (size_t)o * 6;
        w[2 * o] -= E[0] * v0 + E[1] * v1 + E[2] * v2;
        w[2 * o + 1] -= E[3] * v0 + E[4] * v1 + E[5] * v2;
    }
}

__kernel void camera_partials(__global const double *restrict Jc,     // (n, 2, 9)
                              __global const double *restrict w,      // (n, 2)
                              __global const int *restrict obs,       // (n) in camera order
                              __global const int *restrict seg_start, // (nseg + 1)
                              __global double *restrict partial,      // (nseg, 9)
                              __global const double *restrict state,
                              const int nseg)
{
    const int s = get_global_id(0);
    if (s >= nseg || state[S_STATUS] != RUNNING) return;
%for a in range(9):
    double acc${a} = 0.0;
%endfor
    const int end = seg_start[s + 1];
    for (int k = seg_start[s]; k < end; ++k) {
        const int o = obs[k];
        __global const double *f = Jc + (size_t)o * 18;
        const double w0 = w[2 * o], w1 = w[2 * o + 1];
%for a in range(9):
        acc${a} += f[${a}] * w0 + f[${9 + a}] * w1;
%endfor
    }
%for a in range(9):
    partial[(size_t)s * 9 + ${a}] = acc${a};
%endfor
}

// Per run of one camera's observations (camera order, point order within a camera; runs never
// split one camera-point group): the upper triangle (45 entries, row-major) of
//   sum over the camera's points p of G_p V_p^-1 G_p^T,  G_p = sum over its observations of p of W_o,
// W_o = F_o^T E_o (9x3). That is the pairs' sum of S's diagonal block for this camera, a point seen
// twice by one camera included: sum over o1, o2 of W_o1 V^-1 W_o2^T = G V^-1 G^T.
__kernel void jacobi_blocks(__global const double *restrict Jc,      // (n, 2, 9)
                            __global const double *restrict Jp,      // (n, 2, 3)
                            __global const int *restrict obs,        // (n) in camera order
                            __global const int *restrict pt,         // (n)
                            __global const int *restrict seg_start,  // (nseg + 1)
                            __global const double *restrict Vinv,    // (npt, 3, 3)
                            __global double *restrict out,           // (nseg, 45)
                            const int nseg)
{
    const int s = get_global_id(0);
    if (s >= nseg) return;
<% tri = [(a, b) for a in range(9) for b in range(a, 9)] %>
%for a, b in tri:
    double acc${a}_${b} = 0.0;
%endfor
    const int end = seg_start[s + 1];
    int k = seg_start[s];
    while (k < end) {
        const int p = pt[obs[k]];
%for a in range(9):
%for j in range(3):
        double g${a}_${j} = 0.0;
%endfor
%endfor
        for (; k < end && pt[obs[k]] == p; ++k) {
            __global const double *f = Jc + (size_t)obs[k] * 18;
            __global const double *e = Jp + (size_t)obs[k] * 6;
%for a in range(9):
%for j in range(3):
            g${a}_${j} += f[${a}] * e[${j}] + f[${9 + a}] * e[${3 + j}];
%endfor
%endfor
        }
        __global const double *M = Vinv + (size_t)p * 9;
%for j in range(3):
%for i in range(3):
        const double m${j}${i} = M[${3 * j + i}];
%endfor
%endfor
%for a in range(9):
%for i in range(3):
        const double z${a}_${i} = ${' + '.join(f'g{a}_{j} * m{j}{i}' for j in range(3))};
%endfor
%endfor
%for a, b in tri:
        acc${a}_${b} += ${' + '.join(f'z{a}_{i} * g{b}_{i}' for i in range(3))};
%endfor
    }
%for t, (a, b) in enumerate(tri):
    out[(size_t)s * 45 + ${t}] = acc${a}_${b};
%endfor
}

// The points' step after the cameras' (y_c): y_p = V_p^-1 (g_p - sum over the observations of p
// of E_o^T F_o y_c).
__kernel void back_substitute(__global const double *restrict Jc,     // (n, 2, 9)
                              __global const double *restrict Jp,     // (n, 2, 3)
                              __global const int *restrict cam,       // (n)
                              __global const int *restrict pt_start,  // (npt + 1)
                              __global const double *restrict Vinv,   // (npt, 3, 3)
                              __global const double *restrict gp,     // (npt, 3)
                              __global const double *restrict yc,     // (nc, 9)
                              __global double *restrict yp,           // (npt, 3)
                              const int npt)
{
    const int p = get_global_id(0);
    if (p >= npt) return;
    double u0 = gp[3 * p], u1 = gp[3 * p + 1], u2 = gp[3 * p + 2];
    for (int o = pt_start[p]; o < pt_start[p + 1]; ++o) {
        __global const double *f = Jc + (size_t)o * 18;
        __global const double *x = yc + (size_t)cam[o] * 9;
        const double t0 = ${camera_row(0)};
        const double t1 = ${camera_row(1)};
        __global const double *E = Jp + (size_t)o * 6;
%for k in range(3):
        u${k} -= E[${k}] * t0 + E[${3 + k}] * t1;
%endfor
    }
    __global const double *M = Vinv + (size_t)p * 9;
%for k in range(3):
    yp[3 * p + ${k}] = M[${3 * k}] * u0 + M[${3 * k + 1}] * u1 + M[${3 * k + 2}] * u2;
%endfor
}

// Sum of `count` values per work-item over the work-group (buf holds count * L doubles); every
// work-item gets the same sums, so the decisions taken on them are uniform across the group.
// Called unconditionally (with zeros where there is nothing to sum): PoCL's CPU compiler needs
// every barrier on a path all work-items provably take, which a branch on a reduced value is not.
void group_sums(__local double *buf, double *v, const int count)
{
    const int lid = get_local_id(0);
    for (int j = 0; j < count; ++j) buf[j * ${L} + lid] = v[j];
    barrier(CLK_LOCAL_MEM_FENCE);
%for h in [L >> k for k in range(1, L.bit_length()) ]:
    if (lid < ${h})
        for (int j = 0; j < count; ++j) buf[j * ${L} + lid] += buf[j * ${L} + lid + ${h}];
    barrier(CLK_LOCAL_MEM_FENCE);
%endfor
    for (int j = 0; j < count; ++j) v[j] = buf[j * ${L}];
    barrier(CLK_LOCAL_MEM_FENCE);   // buf may be reused at once
}

// (S v)_c for camera c: its segments' partial sums of F^T w plus Dc^2 v.
void camera_product(__global const double *partial, __global const int *cam_seg,
                    __global const double *dc2, __global const double *v, const int c, double *out)
{
    for (int a = 0; a < 9; ++a) out[a] = dc2[9 * c + a] * v[9 * c + a];
    for (int s = cam_seg[c]; s < cam_seg[c + 1]; ++s)
        for (int a = 0; a < 9; ++a) out[a] += partial[(size_t)s * 9 + a];
}

// One work-group; each work-item owns the cameras lid, lid + L, ... in every phase, so only the
// dot products cross work-items.
__kernel __attribute__((reqd_work_group_size(${L}, 1, 1)))
void cg_update(__global const double *restrict partial,   // (nseg, 9)
               __global const int *restrict cam_seg,      // (nc + 1): each camera's segments
               __global const double *restrict dc2,       // (nc * 9)
               __global const double *restrict Pinv,      // (nc, 9, 9) preconditioner blocks
               __global double *restrict b,
               __global double *restrict x,
               __global double *restrict r,
               __global double *restrict p,
               __global double *restrict z,
               __global double *restrict q,
               __global double *restrict state,
               const int nc, const int mode, const int it, const int max_iterations,
               const double q_tolerance, const double r_tolerance)
{
    __local double buf[2 * ${L}];
    const int lid = get_local_id(0);
    const double status0 = state[S_STATUS];
    double rho = state[S_RHO], Q0 = state[S_Q0], tol_r = state[S_TOL_R];
    double status = status0, value = 0.0, iter = state[S_ITER];
    const int active = status0 == RUNNING;
    int next = active;               // go on to the next direction (z, rho, p) afterwards
    double sums[2];

    // Phase 1. START: b = r = the camera sums, x = 0. STEP: q = S p and p'q. RESET: r = b - S x.
    sums[0] = 0.0;
    if (active) {
        for (int c = lid; c < nc; c += ${L}) {
            double Sv[9];
            if (mode == START) {
                for (int a = 0; a < 9; ++a) Sv[a] = 0.0;
                for (int g = cam_seg[c]; g < cam_seg[c + 1]; ++g)
                    for (int a = 0; a < 9; ++a) Sv[a] += partial[(size_t)g * 9 + a];
            } else {
                camera_product(partial, cam_seg, dc2, mode == RESET ? x : p, c, Sv);
            }
            for (int a = 0; a < 9; ++a) {
                const int i = 9 * c + a;
                if (mode == START) { b[i] = Sv[a]; r[i] = Sv[a]; x[i] = 0.0; sums[0] += Sv[a] * Sv[a]; }
                else if (mode == RESET) r[i] = b[i] - Sv[a];
                else { q[i] = Sv[a]; sums[0] += p[i] * Sv[a]; }
            }
        }
    }
    group_sums(buf, sums, 1);
    if (active && mode == START) {
        const double norm_b = sqrt(sums[0]);
        tol_r = r_tolerance * norm_b;
        Q0 = 0.0;                    // -x'(b + r) at x = 0
        rho = 1.0;
        iter = 0.0;
        if (norm_b == 0.0) { status = B_ZERO; next = 0; }
        else if (norm_b <= tol_r) { status = R_SMALL; next = 0; }
    } else if (active && (mode == STEP || mode == STEP_NO_R)) {
        const double pq = sums[0], alpha = rho / pq;
        if (pq <= 0.0 || isinf(pq)) { status = INDEFINITE; value = pq; iter = it; next = 0; }
        else if (!isfinite(alpha)) { status = FAIL_ALPHA; value = alpha; iter = it; next = 0; }
        else {
            for (int c = lid; c < nc; c += ${L})
                for (int a = 0; a < 9; ++a) {
                    const int i = 9 * c + a;
                    x[i] += alpha * p[i];
                    if (mode == STEP) r[i] -= alpha * q[i];
                }
            if (mode == STEP_NO_R) next = 0;     // RESET computes r and goes on
        }
    }

    // Phase 2, the end of iteration `it`: Ceres' tests on the quadratic model and the residual.
    const int test = next && mode != START;
    sums[0] = sums[1] = 0.0;
    if (test)
        for (int c = lid; c < nc; c += ${L})
            for (int a = 0; a < 9; ++a) {
                const int i = 9 * c + a;
                sums[0] += x[i] * (b[i] + r[i]);
                sums[1] += r[i] * r[i];
            }
    group_sums(buf, sums, 2);
    if (test) {
        const double Q1 = -sums[0], zeta = it * (Q1 - Q0) / Q1;
        iter = it;
        if (zeta < q_tolerance) { status = ZETA; value = zeta; next = 0; }
        else {
            Q0 = Q1;
            if (sqrt(sums[1]) <= tol_r) { status = R_SMALL; next = 0; }
            else if (it >= max_iterations) { status = MAX_ITER; next = 0; }
        }
    }

    // Phase 3, the next direction: z = M r, rho = r'z, p = z + beta p (p = z at the start).
    sums[0] = 0.0;
    if (next)
        for (int c = lid; c < nc; c += ${L}) {
            __global const double *M = Pinv + (size_t)c * 81;
            for (int a = 0; a < 9; ++a) {
                double s = 0.0;
                for (int k = 0; k < 9; ++k) s += M[9 * a + k] * r[9 * c + k];
                z[9 * c + a] = s;
                sums[0] += r[9 * c + a] * s;
            }
        }
    group_sums(buf, sums, 1);
    if (next) {
        const double last_rho = rho;
        rho = sums[0];
        iter = (mode == START) ? 1.0 : it + 1.0;
        const double beta = rho / last_rho;
        if (rho == 0.0 || !isfinite(rho)) { status = FAIL_RHO; value = rho; }
        else if (mode != START && (beta == 0.0 || !isfinite(beta))) { status = FAIL_BETA; value = beta; }
        else
            for (int c = lid; c < nc; c += ${L})
                for (int a = 0; a < 9; ++a) {
                    const int i = 9 * c + a;
                    p[i] = (mode == START) ? z[i] : z[i] + beta * p[i];
                }
    }
    // Every work-item has read the state: item 0 may write it now.
    barrier(CLK_GLOBAL_MEM_FENCE);
    if (active && lid == 0) {
        state[S_STATUS] = status;
        state[S_ITER] = iter;
        state[S_RHO] = rho;
        state[S_Q0] = Q0;
        state[S_TOL_R] = tol_r;
        state[S_VALUE] = value;
    }
}
