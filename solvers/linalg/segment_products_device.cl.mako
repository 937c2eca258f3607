## Segmented sums of small block products, the one kernel behind the OpenCL Schur complement:
##
##   out[s][a][b] = sum over p in [seg_start[s], seg_start[s+1]) of
##                  sum_k X[i1(p)][a][k] * Y[i2(p)][b][k]
##
## X is (*, NA, K), Y is (*, NB, K), row-major doubles; i1(p) is p itself (identity1) or
## i1[p], likewise i2. One work-item owns R consecutive output rows (s, a0 .. a0+R-1) of one
## segment: a gather, no atomics; R rows per item reuse each loaded Y block R times.
## Parameters: NA, NB, K, R (block sizes, unrolled; R divides NA), identity1, identity2, and
## x_t / y_t: the block is stored transposed, (K, NA) instead of (NA, K) (a Jacobian block as the
## model returns it).
<%namespace name="common" file="/clkernels/common.cl.mako"/>
${common.fp64_pragma()}
<%
    def xi(r, k):
        return f"x[{k * NA + r}]" if x_t else f"x[{r * K + k}]"
    def yi(b, k):
        return f"y[{k * NB + b}]" if y_t else f"y[{b * K + k}]"
    G = NA // R
%>
__kernel void segment_products(__global const double *restrict X,
                               __global const double *restrict Y,
%if not identity1:
                               __global const int *restrict i1,
%endif
%if not identity2:
                               __global const int *restrict i2,
%endif
                               __global const int *restrict seg_start,
                               __global double *restrict out,
                               const int nseg)
{
    const int gid = get_global_id(0);
    if (gid >= nseg * ${G}) return;
    const int s = gid / ${G};
    const int a0 = (gid - s * ${G}) * ${R};
%for r in range(R):
%for b in range(NB):
    double acc${r}_${b} = 0.0;
%endfor
%endfor
    const int end = seg_start[s + 1];
    for (int p = seg_start[s]; p < end; ++p) {
        const int o1 = ${'p' if identity1 else 'i1[p]'};
        const int o2 = ${'p' if identity2 else 'i2[p]'};
        __global const double *x = X + (size_t)o1 * ${NA * K} + ${'a0' if x_t else f'a0 * {K}'};
        __global const double *y = Y + (size_t)o2 * ${NB * K};
%for r in range(R):
%for k in range(K):
        const double x${r}_${k} = ${xi(r, k)};
%endfor
%endfor
%for b in range(NB):
%for k in range(K):
        const double y${b}_${k} = ${yi(b, k)};
%endfor
%for r in range(R):
        acc${r}_${b} += ${' + '.join(f'x{r}_{k} * y{b}_{k}' for k in range(K))};
%endfor
%endfor
    }
    __global double *o = out + ((size_t)s * ${NA} + a0) * ${NB};
%for r in range(R):
%for b in range(NB):
    o[${r * NB + b}] = acc${r}_${b};
%endfor
%endfor
}
