## Definitions every pyclad kernel starts with: the types and the pc_* helpers that the op
## table's expressions use (pyclad/ops.py). Parameters: real ('float' or 'double') and lanes:
## with lanes > 1 every value is an OpenCL vector holding that many tuples (CPUs: SIMD through
## the vector types, which the compiler maps to AVX/NEON), else a scalar (GPUs).
<%namespace name="common" file="/clkernels/common.cl.mako"/>
<%def name="preamble(real, lanes=1)">
%if real == 'double':
${common.fp64_pragma()}
%endif
typedef ${real} scalar_t;
%if lanes > 1:
typedef ${real}${lanes} real_t;
%else:
typedef ${real} real_t;
%endif
// An elementwise select; for vectors the condition is the comparison's per-lane mask.
#define pc_where(c, x, y) ((c) ? (real_t)(x) : (real_t)(y))
// NaN in either operand gives NaN (fmin/fmax would drop it).
real_t pc_min(real_t a, real_t b) { return (isnan(a) || a < b) ? a : b; }
real_t pc_max(real_t a, real_t b) { return (isnan(a) || a > b) ? a : b; }
</%def>
