## The tape interpreter: one generic kernel per (parameter layout, dtype, variant), whatever the
## graph (pyclad/tape.py builds the tables and documents the variants). A persistent grid:
## each work-item strides over blocks of lanes x blocks tuples and walks the forward table and
## each output's reverse table with one switch per instruction, the case looping over its
## vectors. Op cases come from the op table.
<%namespace name="pre" file="/pyclad/preamble.cl.mako"/>
${pre.preamble(real, lanes)}
<% T = lanes * blocks %>
<% LANE = '0123456789ABCDEF' %>
<% TAB = '__constant' if tables == 'constant' else '__global const' %>
<% D = sum(group_sizes) %>
## m: adjoint planes per slot (one per output in a joint sweep)
<% m = n_outputs if joint else 1 %>

%for name, code in opcodes:
#define OP_${name.upper()} ${code}
%endfor
#define FOR_K _Pragma("unroll") for (int k = 0; k < ${blocks}; ++k)

## Lane l of block k of a vector value (a scalar when lanes == 1).
<%def name="lane(v, l)">\
%if lanes == 1:
${v}\
%else:
${v}.s${LANE[l]}\
%endif
</%def>
## dst = the vector of per-lane expressions (a function of the lane number), through a private
## array and vload: Oclgrind 21.10 tracks a vector literal of loads into global memory as
## uninitialised; this form it tracks, and CPU compilers emit the same gather.
<%def name="gather(dst, expr)">\
%if lanes == 1:
${dst} = ${expr(0)};\
%else:
{ const scalar_t g_[${lanes}] = {${", ".join(expr(l) for l in range(lanes))}}; ${dst} = vload${lanes}(0, g_); }\
%endif
</%def>

__kernel void pyclad_tape(
%for g in range(n_groups):
    __global const scalar_t *restrict p${g},
%endfor
    __global const int *restrict idx,          // (n, ${n_groups}): the row of each group a tuple uses
%if data_size:
    __global const scalar_t *restrict data,
%endif
    __global scalar_t *restrict out,
%if jacobians:
%for g in range(n_groups):
    __global scalar_t *restrict jac${g},
%endfor
%endif
    ${TAB} int8 *restrict fwd,      // (op, dst, a, b, c, constant, -, -) per node, operands first
    ${TAB} scalar_t *restrict consts,
    const int n_fwd,
    ${TAB} int4 *restrict rev,      // per instruction: (op, slot of r, adjoint slot), (slots of a, b, c), (adjoint slots of a, b, c)
    ${TAB} int *restrict rev_offsets,  // output o's instructions: rev_offsets[o] .. rev_offsets[o + 1]
    ${TAB} int *restrict seeds,     // per output: its adjoint slot, or -1 if it has no derivative
    ${TAB} int *restrict outputs,   // per output: its value slot
    ${TAB} int *restrict leaf_slots,   // (outputs, ${D}): each input component's adjoint slot, or -1
%if preload:
    ${TAB} int *restrict input_slots,  // (${D + data_size}): each input, then data, component's value slot, or -1
%endif
%if layout != 'local':
    __global real_t *restrict val, __global real_t *restrict adj,  // the grid's scratch
%endif
    const int n_values, const int n_adjoints, const int n)
{
    const int gid = get_global_id(0), items = get_global_size(0);
%if layout == 'item':
    // A work-item's slots, contiguous (CPUs: its working set stays in L1).
    __global real_t *restrict myval = val + (size_t)gid * n_values * ${blocks};
    __global real_t *restrict myadj = adj + (size_t)gid * n_adjoints * ${m * blocks};
#define V(s, k) myval[(size_t)(s) * ${blocks} + (k)]
#define A(s, o, k) myadj[((size_t)(s) * ${m} + (o)) * ${blocks} + (k)]
%elif layout == 'node':
    // Slot-major across the grid: the lanes of a warp touch consecutive addresses.
#define V(s, k) val[((size_t)(s) * ${blocks} + (k)) * items + gid]
#define A(s, o, k) adj[(((size_t)(s) * ${m} + (o)) * ${blocks} + (k)) * items + gid]
%else:
    // Local memory, slot-major across the work-group (no bank conflicts).
    __local real_t lval[${local_slots[0] * blocks * wg}], ladj[${local_slots[1] * m * blocks * wg}];
    const int lid = get_local_id(0);
#define V(s, k) lval[((s) * ${blocks} + (k)) * ${wg} + lid]
#define A(s, o, k) ladj[(((s) * ${m} + (o)) * ${blocks} + (k)) * ${wg} + lid]
%endif
%if jacobians and joint:
    // The joint sweep clears each adjoint it reads (a sweep per output assigns first
    // contributions instead, and needs no clearing).
    for (int s = 0; s < n_adjoints; ++s) for (int o = 0; o < ${m}; ++o) FOR_K A(s, o, k) = 0;
%endif
%if jacobians and zero_slot >= 0 and not joint:
    // The adjoint of a library superinstruction's output that a sweep did not reach.
    FOR_K A(${zero_slot}, 0, k) = 0;
%endif
    for (int base = gid * ${T}; base < n; base += items * ${T}) {
        // The rows each lane reads (the tail lanes repeat the last tuple and are not stored).
%for l in range(T):
        const size_t t${l} = min(base + ${l}, n - 1);
%for g in range(n_groups):
        __global const scalar_t *row${g}_${l} = p${g} + (size_t)idx[t${l} * ${n_groups} + ${g}] * ${group_sizes[g]};
%endfor
%if data_size:
        __global const scalar_t *drow_${l} = data + t${l} * ${data_size};
%endif
%endfor
        const bool full = base + ${T} <= n;   // no tail lane: stores need no test
%if preload:
        // The inputs, unrolled: no dispatch per component (the forward table has no leaves).
        // Each source: (its rows' prefix, components, first entry in input_slots).
<% sources = [(f"row{g}_", group_sizes[g], sum(group_sizes[:g])) for g in range(n_groups)] + ([("drow_", data_size, D)] if data_size else []) %>
%for prefix, size, offset in sources:
        for (int c = 0; c < ${size}; ++c) {
            const int s = input_slots[${offset} + c];
            if (s >= 0) {
%for k in range(blocks):
                ${gather(f"V(s, {k})", lambda l: f"{prefix}{k * lanes + l}[c]")}
%endfor
            }
        }
%endfor
%endif
        for (int i = 0; i < n_fwd; ++i) {
            const int8 f = fwd[i];
            switch (f.s0 & ~${guard_bit}) {  // the guard bit only matters in the reverse sweep
            case OP_INPUT:
                switch (f.s2) {
%for g in range(n_groups):
                case ${g}:
%for k in range(blocks):
                    ${gather(f"V(f.s1, {k})", lambda l: f"row{g}_{k * lanes + l}[f.s3]")}
%endfor
                    break;
%endfor
                }
                break;
%if data_size:
            case OP_DATA:
%for k in range(blocks):
                ${gather(f"V(f.s1, {k})", lambda l: f"drow_{k * lanes + l}[f.s3]")}
%endfor
                break;
%endif
            case OP_CONST: FOR_K V(f.s1, k) = (real_t)consts[f.s5]; break;
%for case in forward_cases:
            ${case}
%endfor
            default: FOR_K V(f.s1, k) = (real_t)NAN;
            }
        }
<%def name="store(ptr, row_size, column, value)">\
%for k in range(blocks):
{ const real_t q = ${value.replace("@k", str(k))};
%for l in range(lanes):
            if (full || base + ${k * lanes + l} < n) ${ptr}[(size_t)(base + ${k * lanes + l}) * ${row_size} + ${column}] = ${lane("q", l)};
%endfor
}
%endfor
</%def>
%for o in range(n_outputs):
        ${store("out", n_outputs, o, f"V(outputs[{o}], @k)")}
%endfor
%if jacobians:
<%def name="sweep(first, last)">
            for (int j = ${first}; j < ${last}; ++j) {
                const int4 r0 = rev[3 * j], r1 = rev[3 * j + 1], r2 = rev[3 * j + 2];
                switch (r0.s0) {
%for case in reverse_cases:
                ${case}
%endfor
                default: break;
                }
            }
</%def>
<%def name="jacobian_rows(o, plane)">
<% offset = 0 %>
%for g in range(n_groups):
            for (int c = 0; c < ${group_sizes[g]}; ++c) {
                const int s = leaf_slots[${o} * ${D} + ${offset} + c];
                ${store(f"jac{g}", f"{n_outputs * group_sizes[g]}", f"{o} * {group_sizes[g]} + c", f"s >= 0 ? A(s, {plane}, @k) : (real_t)0")}
%if joint:
                if (s >= 0) FOR_K A(s, ${plane}, k) = 0;
%endif
            }
<% offset += group_sizes[g] %>
%endfor
</%def>
%if joint:
        // One sweep for every output: each adjoint slot holds ${m} planes, one per output.
        for (int o = 0; o < ${m}; ++o) if (seeds[o] >= 0) FOR_K A(seeds[o], o, k) = 1;
        ${sweep("0", "rev_offsets[1]")}
        for (int o = 0; o < ${m}; ++o) {
            ${jacobian_rows("o", "o")}
        }
%else:
        for (int o = 0; o < ${n_outputs}; ++o) {
            if (seeds[o] >= 0) FOR_K A(seeds[o], 0, k) = 1;
            ${sweep("rev_offsets[o]", "rev_offsets[o + 1]")}
            ${jacobian_rows("o", "0")}
        }
%endif
%endif
    }
#undef V
#undef A
}
