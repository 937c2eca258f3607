## Segmented sums of small block products, the one kernel behind the OpenCL Schur complement:
##
##   out[s][a][b] = sum over p in [seg_start[s], seg_start[s+1]) of
##                  sum_k X[i1(p)][a][k] * Y[i2(p)][b][k]
##
## X is (*, NA, K), Y is (*, NB, K), row-major doubles; i1(p) is p itself (identity1) or
## i1[p], likewise i2. One work-item owns one output row (s, a): a gather, no atomics.
## Parameters: NA, NB, K (block sizes, unrolled), identity1, identity2, and x_t / y_t: the
## block is stored transposed, (K, NA) instead of (NA, K) (a Jacobian block as the model returns it).
<%namespace name="common" file="/clkernels/common.cl.mako"/>
${common.fp64_pragma()}

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
    if (gid >= nseg * ${NA}) return;
    const int s = gid / ${NA};
    const int a = gid - s * ${NA};
%for b in range(NB):
    double acc${b} = 0.0;
%endfor
    const int end = seg_start[s + 1];
    for (int p = seg_start[s]; p < end; ++p) {
        const int o1 = ${'p' if identity1 else 'i1[p]'};
        const int o2 = ${'p' if identity2 else 'i2[p]'};
%if x_t:
        __global const double *x = X + (size_t)o1 * ${NA * K} + a;
%else:
        __global const double *x = X + ((size_t)o1 * ${NA} + a) * ${K};
%endif
        __global const double *y = Y + (size_t)o2 * ${NB * K};
%for k in range(K):
        const double x${k} = x[${k * NA if x_t else k}];
%endfor
%for b in range(NB):
        acc${b} += ${' + '.join(f'x{k} * y[{(k * NB + b) if y_t else (b * K + k)}]' for k in range(K))};
%endfor
    }
    __global double *o = out + ((size_t)s * ${NA} + a) * ${NB};
%for b in range(NB):
    o[${b}] = acc${b};
%endfor
}
