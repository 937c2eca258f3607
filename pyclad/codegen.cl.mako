## Straight-line kernel for one traced function: every node a private variable, the
## reverse sweeps unrolled with only the non-zero adjoint contributions (pyclad/codegen.py
## writes the statements). One work-item evaluates one tuple.
## stage_wg > 0 (GPUs): Jacobian rows go through local memory so that a work-group writes
## its contiguous block of each Jacobian with coalesced stores, instead of every work-item
## writing m*d values at a stride of m*d (the kernel must then run with exactly stage_wg
## work-items per group, and every work-item reaches the barrier).
<% D = sum(group_sizes) %>
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
%if jacobians and stage_wg:
    __local real_t stage[${stage_wg * n_outputs * D}];
    const int lid = get_local_id(0);
    if (t < n) {
%else:
    if (t >= n) return;
%endif
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
<% offset = 0 %>
%for g in range(n_groups):
%for j in range(group_sizes[g]):
%if stage_wg:
        stage[(lid * ${n_outputs} + ${k}) * ${D} + ${offset + j}] = ${sweep.adjoint(g, j)};
%else:
        jac${g}[((size_t)t * ${n_outputs} + ${k}) * ${group_sizes[g]} + ${j}] = ${sweep.adjoint(g, j)};
%endif
%endfor
<% offset += group_sizes[g] %>
%endfor
    }
%endfor
%if stage_wg:
    }  // t < n
    barrier(CLK_LOCAL_MEM_FENCE);
    const int first = get_group_id(0) * ${stage_wg};
    const int rows = min(${stage_wg}, n - first);
<% offset = 0 %>
%for g in range(n_groups):
<% per_row = n_outputs * group_sizes[g] %>
    for (int e = lid; e < rows * ${per_row}; e += ${stage_wg}) {
        const int row = e / ${group_sizes[g]};  // (work-item, output) pair; column e - row * d
        jac${g}[(size_t)first * ${per_row} + e] = stage[row * ${D} + ${offset} + e - row * ${group_sizes[g]}];
    }
<% offset += group_sizes[g] %>
%endfor
%endif
%endif
}
