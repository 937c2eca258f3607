## Straight-line kernel for one traced function: every node a private variable, the
## reverse sweeps unrolled with only the non-zero adjoint contributions (pyclad/codegen.py
## writes the statements). One work-item evaluates one tuple.
<%namespace name="pre" file="/pyclad/preamble.cl.mako"/>
${pre.preamble(real)}

__kernel void ${name}(
%for g in range(n_groups):
    __global const real_t *restrict p${g},     // parameter group ${g}: (rows, ${group_sizes[g]})
%endfor
    __global const int *restrict idx,          // (n, ${n_groups}): the row of each group a tuple uses
%if data_size:
    __global const real_t *restrict data,      // (n, ${data_size})
%endif
    __global real_t *restrict out,             // (n, ${n_outputs})
%if jacobians:
%for g in range(n_groups):
    __global real_t *restrict jac${g},         // (n, ${n_outputs}, ${group_sizes[g]})
%endfor
%endif
    const int n)
{
    const int t = get_global_id(0);
    if (t >= n) return;
%for g in range(n_groups):
    __global const real_t *row${g} = p${g} + (size_t)idx[(size_t)t * ${n_groups} + ${g}] * ${group_sizes[g]};
%endfor
%if data_size:
    __global const real_t *drow = data + (size_t)t * ${data_size};
%endif
%for line in forward:
    ${line}
%endfor
%for k, value in enumerate(output_values):
    out[(size_t)t * ${n_outputs} + ${k}] = ${value};
%endfor
%if jacobians:
%for k, sweep in enumerate(sweeps):
    {   // reverse sweep for output ${k}
%for line in sweep.lines:
        ${line}
%endfor
%for g in range(n_groups):
%for j in range(group_sizes[g]):
        jac${g}[((size_t)t * ${n_outputs} + ${k}) * ${group_sizes[g]} + ${j}] = ${sweep.adjoint(g, j)};
%endfor
%endfor
    }
%endfor
%endif
}
