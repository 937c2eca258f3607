## Straight-line kernel for one traced function: every node a private variable, the
## reverse sweeps unrolled with only the non-zero adjoint contributions (pyclad/codegen.py
## writes the statements).
## lanes: tuples per work-item. 1 on GPUs; on CPUs each value is a vector of `lanes` tuples
## (loads gather one row per lane; the tail lanes repeat the last tuple and are not stored).
## stage_wg > 0 (GPUs): Jacobian rows go through local memory so that a work-group writes
## its contiguous block of each Jacobian with coalesced stores, instead of every work-item
## writing m*d values at a stride of m*d (the kernel must then run with exactly stage_wg
## work-items per group, and every work-item reaches the barrier).
<% D = sum(group_sizes) %>
<% LANE = '0123456789ABCDEF' %>
<%namespace name="pre" file="/pyclad/preamble.cl.mako"/>
${pre.preamble(real, lanes)}

<%def name="store(ptr, row_size, column, value)">\
%if lanes == 1:
${ptr}[(size_t)t * ${row_size} + ${column}] = ${value};
%else:
{ const real_t q = ${value};
%for l in range(lanes):
  if (t + ${l} < n) ${ptr}[(size_t)(t + ${l}) * ${row_size} + ${column}] = q.s${LANE[l]};
%endfor
}
%endif
</%def>

__kernel void ${name}(
%for g in range(n_groups):
    __global const scalar_t *restrict p${g},   // parameter group ${g}: (rows, ${group_sizes[g]})
%endfor
    __global const int *restrict idx,          // (n, ${n_groups}): the row of each group a tuple uses
%if data_size:
    __global const scalar_t *restrict data,    // (n, ${data_size})
%endif
    __global scalar_t *restrict out,           // (n, ${n_outputs})
%if jacobians:
%for g in range(n_groups):
    __global scalar_t *restrict jac${g},       // (n, ${n_outputs}, ${group_sizes[g]})
%endfor
%endif
    const int n)
{
    const int t = get_global_id(0) * ${lanes};
%if jacobians and stage_wg:
    __local scalar_t stage[${stage_wg * n_outputs * D}];
    const int lid = get_local_id(0);
    if (t < n) {
%else:
    if (t >= n) return;
%endif
%if lanes == 1:
%for g in range(n_groups):
    __global const scalar_t *row${g} = p${g} + (size_t)idx[(size_t)t * ${n_groups} + ${g}] * ${group_sizes[g]};
#define LOAD_P${g}(j) row${g}[j]
%endfor
%if data_size:
    __global const scalar_t *drow = data + (size_t)t * ${data_size};
#define LOAD_D(j) drow[j]
%endif
%else:
%for l in range(lanes):
    const size_t t${l} = min(t + ${l}, n - 1);
%for g in range(n_groups):
    __global const scalar_t *row${g}_${l} = p${g} + (size_t)idx[t${l} * ${n_groups} + ${g}] * ${group_sizes[g]};
%endfor
%if data_size:
    __global const scalar_t *drow_${l} = data + t${l} * ${data_size};
%endif
%endfor
%for g in range(n_groups):
#define LOAD_P${g}(j) ((real_t)(${", ".join(f"row{g}_{l}[j]" for l in range(lanes))}))
%endfor
%if data_size:
#define LOAD_D(j) ((real_t)(${", ".join(f"drow_{l}[j]" for l in range(lanes))}))
%endif
%endif
%for line in forward:
    ${line}
%endfor
%for k, value in enumerate(output_values):
    ${store("out", n_outputs, k, value)}
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
        ${store(f"jac{g}", n_outputs * group_sizes[g], k * group_sizes[g] + j, sweep.adjoint(g, j))}
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
