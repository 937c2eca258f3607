## Sparse4D multi-camera, multi-scale deformable aggregation: forward and backward.
##
## Layouts (all row-major, channels last):
##   feat     [bs, num_feat, C]            rows: camera, then scale, then pixels
##   shape    [cams, S, 2] (H, W)          start [cams, S]: first row of each block
##   loc      [bs*A, P, cams, 2] (x, y)    in [0, 1]; "qc" below indexes (ba, p, cam)
##   weights  [bs*A, P, cams, S, G]        groups innermost
##   out      [bs*A, C]
##
## Render-time parameters:
##   st, ws        Storage of the features (and grad_out/out) and of the weights
##   C, G, S       channels, groups, scales (loops over scales and channels unroll)
##   CPG, IPG, ITEMS  derived: channels per group, work-items per group (CPG / CPT),
##                 work-items per anchor or per qc (C / CPT)
##   CPT           channels per work-item, all of one group (locations, weights and the four
##                 bilinear coefficients are computed once and reused for CPT channels)
##   VEC           load width for the contiguous layout (vloadN / vload_halfN)
##   INTERLEAVE    False: an item owns CPT adjacent channels (vector loads, best for CPUs);
##                 True: it owns channels i, i + IPG, i + 2 IPG, ... so that neighbouring
##                 work-items touch neighbouring channels (coalesced scalar loads and atomics
##                 on GPUs)
##   SPLIT         forward: work-items that share one output, each taking every SPLIT-th
##                 (point, camera), summed in local memory in a fixed order
##   SCATTER       backward: feature gradient by atomic scatter in da_backward (True) or by
##                 da_index + da_backward_feat (False)
##   GPI           da_backward_feat: groups per work-item (CPT channels in each)
##   info          DeviceInfo (chooses the atomic add)
##   KIND          'aggregate' (everything below) or 'format' (feature_maps_format only)
<%page args="KIND, E=None, LEVELS=(), st=None, ws=None, info=None, C=1, G=1, S=0, CPT=1, VEC=1,
              INTERLEAVE=False, SPLIT=1, SCATTER=True, GPI=1, CPG=1, IPG=1, ITEMS=1"/>
<%namespace name="common" file="/clkernels/common.cl.mako"/>
%if KIND == 'format':
// feature_maps_format on the device, every level in one launch: level l [bs, cams, C, H*W]
// into its rows of [bs, num_feat, C]. LEVELS holds per level (H*W, first row in a camera's
// block, first work-item, work-items); elements are copied as raw bits (E: uint for float,
// ushort for half and bfloat16).
inline void format_copy(__global const ${E} *restrict src, __global ${E} *restrict dst, const int i,
                        const int HW, const int level_row, const int cams, const int C,
                        const int num_feat, const int rows_per_cam)
{
    const int ic = i / HW, pix = i - ic * HW;
    const int bc = ic / C, c = ic - bc * C;
    const int b = bc / cams, cam = bc - b * cams;
    dst[((size_t)b * num_feat + cam * rows_per_cam + level_row + pix) * C + c] = src[i];
}

__kernel void da_format_levels(
%for l in range(len(LEVELS)):
    __global const ${E} *restrict src${l},
%endfor
    __global ${E} *restrict dst, const int cams, const int C, const int num_feat,
    const int rows_per_cam)
{
    const int i = get_global_id(0);
%for l, (hw, row, first, n) in enumerate(LEVELS):
    ${'if' if l == 0 else 'else if'} (i >= ${first} && i < ${first + n})
        format_copy(src${l}, dst, i - ${first}, ${hw}, ${row}, cams, C, num_feat, rows_per_cam);
%endfor
}
%else:
${common.bilinear_taps('float')}
${common.atomic_add(info, 'float')}
${st.helpers(ws)}

// Quotients and remainders below are written q = x / n, r = x - q * n: LLVM turns an x / n,
// x % n pair into code with a `freeze` instruction that Oclgrind's checks cannot run.

// Pixel position of a normalised coordinate. Contraction is off so that t * n is rounded
// before the subtraction, as in the original operator (a fused multiply-add would round once).
inline float pixel_pos(float t, int n)
{
#pragma OPENCL FP_CONTRACT OFF
    return t * (float)n - 0.5f;
}

// Strictly inside (0, 1) in both coordinates. NaN fails every comparison, so NaN and Inf
// locations count as outside and never reach an index computation.
inline int location_inside(float x, float y)
{
    return x > 0.0f && x < 1.0f && y > 0.0f && y < 1.0f;
}

## Fill `float dst[CPT]` with the item's channels of the row that `ptr` points at (ptr is
## already offset by the item's first channel).
<%def name="load_channels(dst, ptr, storage)">
%if INTERLEAVE or VEC == 1:
%   for j in range(CPT):
    ${dst}[${j}] = ${storage.load('(' + ptr + ')', (str(j * IPG) if INTERLEAVE else str(j)))};
%   endfor
%else:
%   for j0 in range(0, CPT, VEC):
    {
        const float${VEC} t_ = ${storage.loadn(VEC, ptr + ' + ' + str(j0), '0')};
%       for k in range(VEC):
        ${dst}[${j0 + k}] = t_.s${"0123456789abcdef"[k]};
%       endfor
    }
%   endfor
%endif
</%def>

## Store `float src[CPT]` into the row at `ptr` (offset by the item's first channel).
<%def name="store_channels(src, ptr, storage)">
%if INTERLEAVE or VEC == 1:
%   for j in range(CPT):
    ${storage.store(src + '[' + str(j) + ']', '(' + ptr + ')', (str(j * IPG) if INTERLEAVE else str(j)))};
%   endfor
%else:
%   for j0 in range(0, CPT, VEC):
    ${storage.storen(VEC, '(float' + str(VEC) + ')(' + ', '.join(src + '[' + str(j0 + k) + ']' for k in range(VEC)) + ')', ptr + ' + ' + str(j0), '0')};
%   endfor
%endif
</%def>

## First channel of work-item t (0 <= t < ITEMS) and its group.
<%def name="item_channels(t)">
    const int grp = ${t} / ${IPG};
    const int c0 = grp * ${CPG} + (${t} - grp * ${IPG}) * ${1 if INTERLEAVE else CPT};
</%def>

// ---------------------------------------------------------------------------------------
// Forward as a gather: a work-item owns CPT output channels of one anchor and loops over
// points x cameras x scales in registers. Deterministic: no atomics, a fixed order.
__kernel void da_forward(
    __global const ${st.ptr} *restrict feat,
    __global const int *restrict shape,
    __global const int *restrict start,
    __global const float *restrict loc,
    __global const ${ws.ptr} *restrict weights,
    __global ${st.ptr} *restrict out,
    const int A, const int P, const int cams, const int num_feat, const int n_tasks
%if SPLIT > 1:
    , __local float *restrict partial
%endif
    )
{
%if SPLIT > 1:
    // Work-group = SPLIT slices x TPW tasks; slice sp takes (point, camera) pairs sp, sp + SPLIT, ...
    const int TPW = get_local_size(0) / ${SPLIT};
    const int sp = get_local_id(0) / TPW, tl = get_local_id(0) - sp * TPW;
    const int task = get_group_id(0) * TPW + tl;
%else:
    const int sp = 0;
    const int task = get_global_id(0);
%endif
    const int active = task < n_tasks;
    const int ba = task / ${ITEMS}, t_item = task - ba * ${ITEMS};
    ${item_channels('t_item')}
    float acc[${CPT}];
%for j in range(CPT):
    acc[${j}] = 0.0f;
%endfor
    if (active) {
        const int b = ba / A;
        __global const ${st.ptr} *fb = feat + (size_t)b * num_feat * ${C} + c0;
        const int n_pc = P * cams;
        for (int pc = sp; pc < n_pc; pc += ${SPLIT}) {
            const int qc = ba * n_pc + pc;
            const int cam = pc % cams;
            const float x = loc[2 * qc], y = loc[2 * qc + 1];
            if (!location_inside(x, y)) continue;
%for s in range(S):
            {
                const int cs = cam * ${S} + ${s};
                const int H = shape[2 * cs], W = shape[2 * cs + 1];
                const float h = pixel_pos(y, H), w = pixel_pos(x, W);
                if (h > -1.0f && h < (float)H && w > -1.0f && w < (float)W) {
                    const float wgt = ${ws.load('weights', '(qc * ' + str(S) + ' + ' + str(s) + ') * ' + str(G) + ' + grp')};
                    int idx[4]; float wt[4]; float lh, lw;
                    bilinear_taps_float(h, w, H, W, idx, wt, &lh, &lw);
                    __global const ${st.ptr} *fs = fb + (size_t)start[cs] * ${C};
%for k in range(4):
                    if (idx[${k}] >= 0) {  // corners unrolled: idx, wt and v stay in registers
                        const float coef = wgt * wt[${k}];
                        float v[${CPT}];
                        ${load_channels('v', 'fs + (size_t)idx[' + str(k) + '] * ' + str(C), st)}
%for j in range(CPT):
                        acc[${j}] += coef * v[${j}];
%endfor
                    }
%endfor
                }
            }
%endfor
        }
    }
%if SPLIT > 1:
    // Slices 1.. park their sums; slice 0 adds them in slice order (same result every run).
    if (sp > 0) {
%for j in range(CPT):
        partial[((sp - 1) * ${CPT} + ${j}) * TPW + tl] = acc[${j}];
%endfor
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (sp == 0 && active) {
        for (int r = 0; r < ${SPLIT - 1}; ++r) {
%for j in range(CPT):
            acc[${j}] += partial[(r * ${CPT} + ${j}) * TPW + tl];
%endfor
        }
%else:
    if (active) {
%endif
        __global ${st.ptr} *o = out + (size_t)ba * ${C} + c0;
        ${store_channels('acc', 'o', st)}
    }
}

// ---------------------------------------------------------------------------------------
// Backward. A work-item owns CPT channels of one (anchor, point, camera) "qc" and loops over
// the scales. Location and weight gradients are sums over channels: each item leaves its
// partial sums in local memory, and the work-group reduces them (first over the items of a
// group, then over groups) and writes each gradient once: no atomics for them, and a fixed
// summation order.
//
// The feature gradient has two formulations (SCATTER):
// - scatter, here: each (sample, corner, channel) is added with the shared float atomic add.
//   It touches every contribution once, coalesced when INTERLEAVE puts neighbouring channels
//   on neighbouring work-items, and on NVIDIA each add is one reduction instruction; but the
//   order of the additions, and so the last bits of grad_feat, may vary between runs, and on
//   CPUs every add is a compare-and-swap loop.
// - gather, below (da_index + da_backward_feat): an inverse index lists, per bilinear cell,
//   the samples whose top-left corner it is, in sample order; each work-item then owns a
//   feature row's channels and sums its contributions in a fixed order. Deterministic, no
//   atomics, each gradient element written once (no zero-fill); it pays for building the
//   index and for recomputing each sample's bilinear weights from every corner.
__kernel void da_backward(
    __global const ${st.ptr} *restrict feat,
    __global const int *restrict shape,
    __global const int *restrict start,
    __global const float *restrict loc,
    __global const ${ws.ptr} *restrict weights,
    __global const ${st.ptr} *restrict grad_out,
%if SCATTER:
    __global float *restrict grad_feat,      // float accumulator, zero-filled
%endif
    __global float *restrict grad_loc,
    __global ${ws.ptr} *restrict grad_w,
    const int A, const int P, const int cams, const int num_feat, const int n_qc,
    __local float *restrict red,             // [S + 2][local size]
    __local float *restrict red2)            // [QPW][2][G]
{
    const int lid = get_local_id(0), lsize = get_local_size(0);
    const int QPW = lsize / ${ITEMS};
    const int ql = lid / ${ITEMS}, t_item = lid - ql * ${ITEMS};
    const int qc = get_group_id(0) * QPW + ql;
    ${item_channels('t_item')}
    float gw[${S}];
%for s in range(S):
    gw[${s}] = 0.0f;
%endfor
    float gx = 0.0f, gy = 0.0f;
    if (qc < n_qc) {
        const float x = loc[2 * qc], y = loc[2 * qc + 1];
        if (location_inside(x, y)) {
            const int ba = qc / (P * cams), cam = qc % cams;
            const int b = ba / A;
            float go[${CPT}];
            ${load_channels('go', 'grad_out + (size_t)ba * ' + str(C) + ' + c0', st)}
            __global const ${st.ptr} *fb = feat + (size_t)b * num_feat * ${C} + c0;
%if SCATTER:
            __global float *gb = grad_feat + (size_t)b * num_feat * ${C} + c0;
%endif
%for s in range(S):
            {
                const int cs = cam * ${S} + ${s};
                const int H = shape[2 * cs], W = shape[2 * cs + 1];
                const float h = pixel_pos(y, H), w = pixel_pos(x, W);
                if (h > -1.0f && h < (float)H && w > -1.0f && w < (float)W) {
                    const float wgt = ${ws.load('weights', '(qc * ' + str(S) + ' + ' + str(s) + ') * ' + str(G) + ' + grp')};
                    int idx[4]; float wt[4]; float lh, lw;
                    bilinear_taps_float(h, w, H, W, idx, wt, &lh, &lw);
                    const size_t row0 = (size_t)start[cs] * ${C};
                    float v[4][${CPT}];
%for k in range(4):
                    if (idx[${k}] >= 0) {
                        ${load_channels('v[' + str(k) + ']', 'fb + row0 + (size_t)idx[' + str(k) + '] * ' + str(C), st)}
                    } else {
%for j in range(CPT):
                        v[${k}][${j}] = 0.0f;
%endfor
                    }
%endfor
                    // d(val)/dw and d(val)/dh of the bilinear sample; outside corners read 0.
                    float sw = 0.0f, sx = 0.0f, sy = 0.0f;
%for j in range(CPT):
                    {
                        const float val = wt[0] * v[0][${j}] + wt[1] * v[1][${j}]
                                        + wt[2] * v[2][${j}] + wt[3] * v[3][${j}];
                        const float dw = (1.0f - lh) * (v[1][${j}] - v[0][${j}]) + lh * (v[3][${j}] - v[2][${j}]);
                        const float dh = (1.0f - lw) * (v[2][${j}] - v[0][${j}]) + lw * (v[3][${j}] - v[1][${j}]);
                        sw += go[${j}] * val;
                        sx += go[${j}] * dw;
                        sy += go[${j}] * dh;
                    }
%endfor
                    gw[${s}] = sw;
                    gx += (float)W * wgt * sx;
                    gy += (float)H * wgt * sy;
%if SCATTER:
%for k in range(4):
                    if (idx[${k}] >= 0) {
                        __global float *g = gb + row0 + (size_t)idx[${k}] * ${C};
                        const float coef = wgt * wt[${k}];
%for j in range(CPT):
                        atomic_add_float(g + ${(str(j * IPG) if INTERLEAVE else str(j))}, go[${j}] * coef);
%endfor
                    }
%endfor
%endif
                }
            }
%endfor
        }
    }
    // Every item, active or not, reaches the barriers.
%for s in range(S):
    red[${s} * lsize + lid] = gw[${s}];
%endfor
    red[${S} * lsize + lid] = gx;
    red[${S + 1} * lsize + lid] = gy;
    barrier(CLK_LOCAL_MEM_FENCE);
    // Stage 1: sum each (qc, quantity, group) over the group's IPG items.
    for (int o = lid; o < QPW * ${(S + 2) * G}; o += lsize) {
        const int og = o / ${G}, gg = o - og * ${G};
        const int oq = og / ${S + 2}, r = og - oq * ${S + 2};
        const int oqc = get_group_id(0) * QPW + oq;
        if (oqc >= n_qc) continue;
        __local const float *src = red + r * lsize + oq * ${ITEMS} + gg * ${IPG};
        float sum = 0.0f;
        for (int i = 0; i < ${IPG}; ++i) sum += src[i];
        if (r < ${S}) {
            ${ws.store('sum', 'grad_w', '(oqc * ' + str(S) + ' + r) * ' + str(G) + ' + gg')};
        } else {
            red2[(oq * 2 + r - ${S}) * ${G} + gg] = sum;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    // Stage 2: location gradients, summed over groups.
    for (int o = lid; o < QPW * 2; o += lsize) {
        const int oqc = get_group_id(0) * QPW + (o >> 1);
        if (oqc >= n_qc) continue;
        float sum = 0.0f;
        for (int gg = 0; gg < ${G}; ++gg) sum += red2[o * ${G} + gg];
        grad_loc[2 * oqc + (o & 1)] = sum;
    }
}

// ---------------------------------------------------------------------------------------
// Inverse index for the gathered feature gradient. One work-group per plane (b, cam, s); its
// R work-items split the plane's (H + 1) x (W + 1) bilinear cells into R ranges. A sample
// belongs to the cell of its top-left corner (floor(h) + 1, floor(w) + 1). Each item walks
// all the plane's samples in order and keeps those of its cells: first counting them, then,
// once the work-group knows where each range starts, writing their ids. No atomics; the ids
// of a cell come out in increasing sample order, so the gather sums in a fixed order.
inline int sample_cell(float x, float y, int H, int W)
{
    if (!location_inside(x, y)) return -1;
    const float h = pixel_pos(y, H), w = pixel_pos(x, W);
    if (!(h > -1.0f && h < (float)H && w > -1.0f && w < (float)W)) return -1;
    return ((int)floor(h) + 1) * (W + 1) + (int)floor(w) + 1;
}

__kernel void da_index(
    __global const int *restrict shape,
    __global const float *restrict loc,
    __global const int *restrict cell_base,   // [cams * S + 1]: first cell of each (cam, s)
    __global int *restrict cell_count,        // [bs * cells], scratch
    __global int *restrict cell_start,        // [bs * cells]
    __global int *restrict cell_end,          // [bs * cells]
    __global int *restrict entries,           // [bs * cams * S * A * P]: in-plane sample ids
    const int A, const int P, const int cams,
    __local int *restrict totals)             // [R]
{
    const int plane = get_group_id(0), r = get_local_id(0), R = get_local_size(0);
    const int b = plane / (cams * ${S}), cs = plane - b * cams * ${S};
    const int cam = cs / ${max(S, 1)};  // never launched when S = 0
    const int H = shape[2 * cs], W = shape[2 * cs + 1];
    const int n_cells = cell_base[cs + 1] - cell_base[cs];
    const int first = (int)((long)n_cells * r / R), last = (int)((long)n_cells * (r + 1) / R);
    const size_t cb = (size_t)b * cell_base[cams * ${S}] + cell_base[cs];
    const int n_samples = A * P;
    for (int c = first; c < last; ++c) cell_count[cb + c] = 0;
    int mine = 0;
    for (int i = 0; i < n_samples; ++i) {
        const size_t qc = ((size_t)b * n_samples + i) * cams + cam;
        const int c = sample_cell(loc[2 * qc], loc[2 * qc + 1], H, W);
        if (c >= first && c < last) { ++cell_count[cb + c]; ++mine; }
    }
    totals[r] = mine;
    barrier(CLK_LOCAL_MEM_FENCE);
    int pos = plane * n_samples;
    for (int q = 0; q < r; ++q) pos += totals[q];
    for (int c = first; c < last; ++c) {
        cell_start[cb + c] = pos;
        cell_end[cb + c] = pos;
        pos += cell_count[cb + c];
    }
    for (int i = 0; i < n_samples; ++i) {
        const size_t qc = ((size_t)b * n_samples + i) * cams + cam;
        const int c = sample_cell(loc[2 * qc], loc[2 * qc + 1], H, W);
        if (c >= first && c < last) entries[cell_end[cb + c]++] = i;
    }
}

// Gathered feature gradient: a work-item owns CPT channels of one feature row, finds the
// (cam, s) blocks that hold the row, and for each of its four roles (the top-left, top-right,
// bottom-left or bottom-right corner of a sample) sums over the samples of the matching cell.
__kernel void da_backward_feat(
    __global const int *restrict shape,
    __global const int *restrict start,
    __global const float *restrict loc,
    __global const ${ws.ptr} *restrict weights,
    __global const ${st.ptr} *restrict grad_out,
    __global const int *restrict cell_base,
    __global const int *restrict cell_start,
    __global const int *restrict cell_end,
    __global const int *restrict entries,
    __global ${st.ptr} *restrict grad_feat,
    const int A, const int P, const int cams, const int num_feat, const int n_items)
{
    // An item owns CPT channels in each of GPI consecutive groups: the sample's bilinear
    // weight is computed once for CPT * GPI channels.
    const int gid = get_global_id(0);
    if (gid >= n_items) return;
    const int brow = gid / ${ITEMS // GPI}, t_item = gid - brow * ${ITEMS // GPI};
    const int g0 = t_item / ${IPG} * ${GPI};
    const int c0 = g0 * ${CPG} + (t_item - t_item / ${IPG} * ${IPG}) * ${1 if INTERLEAVE else CPT};
    const int b = brow / num_feat, row = brow - b * num_feat;
    const int n_samples = A * P;
    float acc[${GPI}][${CPT}];
%for gi in range(GPI):
%for j in range(CPT):
    acc[${gi}][${j}] = 0.0f;
%endfor
%endfor
    for (int cam = 0; cam < cams; ++cam) {
%for s in range(S):
        {
            const int cs = cam * ${S} + ${s};
            const int H = shape[2 * cs], W = shape[2 * cs + 1];
            const int pix = row - start[cs];
            if (pix >= 0 && pix < H * W) {
                const int y = pix / W, x = pix - y * W;
                const size_t cb = (size_t)b * cell_base[cams * ${S}] + cell_base[cs];
                for (int k = 0; k < 4; ++k) {
                    // the cell whose corner k is this pixel: top-left at (y - k / 2, x - k % 2)
                    const int cell = (y - (k >> 1) + 1) * (W + 1) + x - (k & 1) + 1;
                    const int e1 = cell_end[cb + cell];
                    for (int e = cell_start[cb + cell]; e < e1; ++e) {
                        const int i = entries[e];
                        const size_t qc = ((size_t)b * n_samples + i) * cams + cam;
                        const float h = pixel_pos(loc[2 * qc + 1], H), w = pixel_pos(loc[2 * qc], W);
                        // corner k's bilinear weight, computed as bilinear_taps does
                        const float lh = h - floor(h), lw = w - floor(w);
                        const float wk = ((k & 2) ? lh : 1.0f - lh) * ((k & 1) ? lw : 1.0f - lw);
                        __global const ${ws.ptr} *wq = weights + (qc * ${S} + ${s}) * ${G} + g0;
                        __global const ${st.ptr} *gq = grad_out + ((size_t)b * A + i / P) * ${C} + c0;
%for gi in range(GPI):
                        {
                            const float coef = wk * ${ws.load('wq', str(gi))};
                            float go[${CPT}];
                            ${load_channels('go', 'gq + ' + str(gi * CPG), st)}
%for j in range(CPT):
                            acc[${gi}][${j}] += coef * go[${j}];
%endfor
                        }
%endfor
                    }
                }
            }
        }
%endfor
    }
%for gi in range(GPI):
    {
        __global ${st.ptr} *o = grad_feat + (size_t)brow * ${C} + c0 + ${gi * CPG};
        ${store_channels('acc[' + str(gi) + ']', 'o', st)}
    }
%endfor
}

// ---------------------------------------------------------------------------------------
// The original design, kept as the benchmark baseline: one work-item per (anchor, point,
// camera, scale, channel), every contribution an atomic add, in float accumulators.
__kernel void da_forward_original(
    __global const ${st.ptr} *restrict feat,
    __global const int *restrict shape,
    __global const int *restrict start,
    __global const float *restrict loc,
    __global const ${ws.ptr} *restrict weights,
    __global float *restrict out,            // zero-filled
    const int A, const int P, const int cams, const int num_feat, const int n)
{
    int idx = get_global_id(0);
    if (idx >= n) return;
    const float weight = ${ws.load('weights', 'idx / ' + str(CPG))};
    const int qcs = idx / ${C}, c = idx - qcs * ${C};                  // qcs = (ba, p, cam, s)
    const int qc = qcs / ${max(S, 1)}, s = qcs - qc * ${max(S, 1)};  // never launched when S = 0
    const int cam = qc % cams, ba = qc / (P * cams), b = ba / A;
    const float x = loc[2 * qc], y = loc[2 * qc + 1];
    if (!location_inside(x, y)) return;
    const int cs = cam * ${S} + s;
    const int H = shape[2 * cs], W = shape[2 * cs + 1];
    const float h = pixel_pos(y, H), w = pixel_pos(x, W);
    if (!(h > -1.0f && h < (float)H && w > -1.0f && w < (float)W)) return;
    int tap[4]; float wt[4]; float lh, lw;
    bilinear_taps_float(h, w, H, W, tap, wt, &lh, &lw);
    __global const ${st.ptr} *fs = feat + ((size_t)b * num_feat + start[cs]) * ${C} + c;
    float val = 0.0f;
    for (int k = 0; k < 4; ++k)
        if (tap[k] >= 0) val += wt[k] * ${st.load('fs', '(size_t)tap[k] * ' + str(C))};
    atomic_add_float(out + (size_t)ba * ${C} + c, val * weight);
}

__kernel void da_backward_original(
    __global const ${st.ptr} *restrict feat,
    __global const int *restrict shape,
    __global const int *restrict start,
    __global const float *restrict loc,
    __global const ${ws.ptr} *restrict weights,
    __global const ${st.ptr} *restrict grad_out,
    __global float *restrict grad_feat,      // all three zero-filled float accumulators
    __global float *restrict grad_loc,
    __global float *restrict grad_w,
    const int A, const int P, const int cams, const int num_feat, const int n)
{
    int idx = get_global_id(0);
    if (idx >= n) return;
    const int widx = idx / ${CPG};
    const float weight = ${ws.load('weights', 'widx')};
    const int qcs = idx / ${C}, c = idx - qcs * ${C};                  // qcs = (ba, p, cam, s)
    const int qc = qcs / ${max(S, 1)}, s = qcs - qc * ${max(S, 1)};  // never launched when S = 0
    const int cam = qc % cams, ba = qc / (P * cams), b = ba / A;
    const float x = loc[2 * qc], y = loc[2 * qc + 1];
    if (!location_inside(x, y)) return;
    const int cs = cam * ${S} + s;
    const int H = shape[2 * cs], W = shape[2 * cs + 1];
    const float h = pixel_pos(y, H), w = pixel_pos(x, W);
    if (!(h > -1.0f && h < (float)H && w > -1.0f && w < (float)W)) return;
    int tap[4]; float wt[4]; float lh, lw;
    bilinear_taps_float(h, w, H, W, tap, wt, &lh, &lw);
    const size_t base = ((size_t)b * num_feat + start[cs]) * ${C} + c;
    const float go = ${st.load('grad_out', '(size_t)ba * ' + str(C) + ' + c')};
    const float top = go * weight;
    float v[4];
    for (int k = 0; k < 4; ++k) {
        v[k] = 0.0f;
        if (tap[k] >= 0) {
            v[k] = ${st.load('feat', 'base + (size_t)tap[k] * ' + str(C))};
            atomic_add_float(grad_feat + base + (size_t)tap[k] * ${C}, wt[k] * top);
        }
    }
    const float val = wt[0] * v[0] + wt[1] * v[1] + wt[2] * v[2] + wt[3] * v[3];
    const float dw = (1.0f - lh) * (v[1] - v[0]) + lh * (v[3] - v[2]);
    const float dh = (1.0f - lw) * (v[2] - v[0]) + lw * (v[3] - v[1]);
    atomic_add_float(grad_w + widx, go * val);
    atomic_add_float(grad_loc + 2 * qc, (float)W * dw * top);
    atomic_add_float(grad_loc + 2 * qc + 1, (float)H * dh * top);
}

%endif
