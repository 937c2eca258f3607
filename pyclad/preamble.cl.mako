## Definitions every pyclad kernel starts with: the scalar type and the pc_* helpers that
## the op table's expressions use (pyclad/ops.py). Parameter: real ('float' or 'double').
<%def name="preamble(real)">
%if real == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
%endif
typedef ${real} real_t;
#define pc_where(c, x, y) ((c) ? (real_t)(x) : (real_t)(y))
// NaN in either operand gives NaN (fmin/fmax would drop it).
real_t pc_min(real_t a, real_t b) { return (isnan(a) || a < b) ? a : b; }
real_t pc_max(real_t a, real_t b) { return (isnan(a) || a > b) ? a : b; }
</%def>
