## Definitions every pyclad kernel starts with: the types and the pc_* helpers that the op
## table's expressions use (pyclad/ops.py). Parameters: real ('float' or 'double') and lanes:
## with lanes > 1 every value is an OpenCL vector holding that many tuples (CPUs: SIMD through
## the vector types, which the compiler maps to AVX/NEON), else a scalar (GPUs).
<%namespace name="common" file="/clkernels/common.cl.mako"/>
<%! from pyclad import ops %>
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
// The pc_* helpers of pyclad/ops.py's HELPERS table (defined there beside their numpy twins).
%for _name, definition, _numpy in ops.HELPERS:
${definition}
%endfor
</%def>
