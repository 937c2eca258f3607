## The tape interpreter: one generic kernel per (parameter layout, dtype), whatever the
## graph. The node table and the forward and reverse sequences live in global memory; each
## work-item walks them with a switch on the op code, keeping values and adjoints in a
## node-major scratch buffer (coalesced across work-items). Op cases come from the op table.
<%namespace name="pre" file="/pyclad/preamble.cl.mako"/>
${pre.preamble(real)}

%for name, code in opcodes:
#define OP_${name.upper()} ${code}
%endfor

__kernel void pyclad_tape(
%for g in range(n_groups):
    __global const real_t *restrict p${g},
%endfor
    __global const int *restrict idx,          // (n, ${n_groups}): the row of each group a tuple uses
%if data_size:
    __global const real_t *restrict data,
%endif
    __global real_t *restrict out,
%if jacobians:
%for g in range(n_groups):
    __global real_t *restrict jac${g},
%endfor
%endif
    __global const int4 *restrict nodes,    // (op, arg0, arg1, arg2); leaves: (op, group, component, 0)
    __global const real_t *restrict consts, // value of each constant node
    const int n_nodes,                      // the forward sweep: nodes 0 .. n_nodes - 1, operands first
    __global const int *restrict rev,       // reverse sequences of all outputs, concatenated
    __global const int *restrict rev_offsets,  // output o's sequence: rev[rev_offsets[o] .. rev_offsets[o + 1])
    __global const int *restrict seeds,     // per output: its node, or -1 if it has no derivative
    __global const int *restrict outputs,   // per output: its node
    __global const int *restrict leaves,    // per group and component: its node, or -1
    __global real_t *restrict val, __global real_t *restrict adj,  // (nodes, stride) scratch
    const int stride, const int base, const int n)
{
    const int s = get_global_id(0);  // slot in this chunk's scratch
    const int t = base + s;          // tuple
    if (s >= stride || t >= n) return;
#define V(i) val[(size_t)(i) * stride + s]
#define A(i) adj[(size_t)(i) * stride + s]
    for (int i = 0; i < n_nodes; ++i) {
        const int4 nd = nodes[i];
        real_t r;
        switch (nd.x & ~${guard_bit}) {  // the guard bit only matters in the reverse sweep
        case OP_INPUT:
            switch (nd.y) {
%for g in range(n_groups):
            case ${g}: r = p${g}[(size_t)idx[(size_t)t * ${n_groups} + ${g}] * ${group_sizes[g]} + nd.z]; break;
%endfor
            default: r = (real_t)NAN;
            }
            break;
%if data_size:
        case OP_DATA: r = data[(size_t)t * ${data_size} + nd.z]; break;
%endif
        case OP_CONST: r = consts[i]; break;
%for case in forward_cases:
        ${case}
%endfor
        default: r = (real_t)NAN;
        }
        V(i) = r;
    }
%for k in range(n_outputs):
    out[(size_t)t * ${n_outputs} + ${k}] = V(outputs[${k}]);
%endfor
%if jacobians:
    for (int o = 0; o < ${n_outputs}; ++o) {
        for (int i = 0; i < n_nodes; ++i) A(i) = (real_t)0;
        if (seeds[o] >= 0) A(seeds[o]) = (real_t)1;
        for (int k = rev_offsets[o]; k < rev_offsets[o + 1]; ++k) {
            const int i = rev[k];
            const int4 nd = nodes[i];
            const real_t xg = A(i), xr = V(i);
            switch (nd.x) {
%for case in reverse_cases:
            ${case}
%endfor
            default: break;
            }
        }
<% offset = 0 %>
%for g in range(n_groups):
        for (int j = 0; j < ${group_sizes[g]}; ++j) {
            const int leaf = leaves[${offset} + j];
            jac${g}[((size_t)t * ${n_outputs} + o) * ${group_sizes[g]} + j] = leaf >= 0 ? A(leaf) : (real_t)0;
        }
<% offset += group_sizes[g] %>
%endfor
    }
%endif
#undef V
#undef A
}
