## DCNv4 deformable convolution (Xiong et al., CVPR 2024): forward, backward, and the
## float -> storage conversion of the input gradient. Rendered by clkernels/dcnv4.py.
##
## Parameters:
##   direction      'forward', 'backward' (a scatter with atomics: GPUs) or 'backward_owner'
##                  (each work-item owns a slice of the input gradient: CPUs, no atomics)
##   scatter        'backward' only: 'gather' (deterministic: each input pixel gathers the taps
##                  that land near their nominal place, farther ones are summed in 64-bit fixed
##                  point), 'fixed' (all in fixed point, deterministic) or 'atomic' (float
##                  atomics: the last bits depend on the order of arrival)
##   margin         'gather': how far (whole pixels) a tap may land from its nominal place and
##                  still be gathered
##   gather_cpw     'gather': channels per work-item of the gathering kernel (a multiple of vw)
##   weights        'gather': the first kernel hands the gather each near tap's mask * weight
##                  products (tap_weights), instead of the gather recomputing them
##   info           DeviceInfo (atomics and vendor-specific loads)
##   st             Storage of input, offset_mask, output and gradients (float, half or bfloat16)
##   group, channels, kernel_h, kernel_w, remove_center: the operator's shape (compile time,
##                  so the tap loop and the channel loop are fully known to the compiler)
##   cpw            channels per work-item;  vw: vector width of loads/stores (divides cpw)
##   reuse          forward only: bilinear coefficients computed once per tap and used for
##                  all cpw channels (True), or recomputed for every vw-chunk (False, the
##                  "DCNv3 work-item body in a loop" rung of the paper's ablation)
##   interleave     forward and 'backward': a work-item's vw-chunks lie SLOTS * vw channels apart
##                  (chunk c of slot s at channel (c * SLOTS + s) * vw), so that the work-items
##                  sharing a (pixel, group) read one contiguous run per load instruction, not
##                  a strided one (False: its cpw channels are contiguous)
##   prefetch       forward (with reuse) and 'backward': a (pixel, group)'s offsets and masks
##                  loaded into registers before the (unrolled) tap loop; in the gather, a tap's
##                  candidates' codes loaded before they are visited (there always at margins
##                  up to 1: see CODES_FIRST)
##   slots_p2       'backward': work-items per (pixel, group), channels/cpw rounded up to a
##                  power of two; > 1 means a work-group reduction of the offset gradients
##   ptx            NVIDIA only: half <-> float conversions and the float atomic add through
##                  inline PTX, so that half loads stay 16-byte vector loads
<%namespace name="common" file="/clkernels/common.cl.mako"/>
<%
    G, C, CPW, VW = group, channels, cpw, vw
    GC = G * C
    SLOTS = C // CPW
    NCH = CPW // VW
    K = kernel_h * kernel_w - (1 if remove_center else 0)
    T = st.ptr
    vec = 'float' if VW == 1 else 'float%d' % VW
    comps = [''] if VW == 1 else ['.s%x' % e for e in range(VW)]
    raw = {2: 'uint', 4: 'uint2', 8: 'uint4', 16: 'uint8'}.get(VW)
    FIXED = direction == 'backward' and scatter in ('fixed', 'gather')
    # dcnv4_forward and dcnv4_backward: channels between a work-item's chunks, and between
    # neighbouring slots' first channels (see interleave).
    CS, SO = (SLOTS * VW, VW) if interleave else (VW, CPW)
    ptx_half = ptx and st.is_half and VW > 1
%>
%if direction != 'forward':
// No a*b+c fused by the compiler's choice: the offset and mask gradients' sums then round the
// same way in every variant of this kernel (scatter, margin), not as each build schedules them.
#pragma OPENCL FP_CONTRACT OFF
%endif
${common.bilinear_taps('float')}
${st.helpers()}
## ------------------------------------------------------------------ vector access
## ldv(p): the VW channels at p as float(VW); stv(v, p) stores them. p is VW-aligned (the
## launcher checks C % VW == 0 and the buffer alignment), so float storage casts to a
## vector pointer, which compilers turn into vector loads; vload_half<n> only promises
## 2-byte alignment, hence the raw-bits path through PTX on NVIDIA.
%if ptx_half:
inline float2 halves_to_float2(uint bits)
{
    float lo, hi;
    asm("{ .reg .b16 t0, t1;\n\t mov.b32 {t0, t1}, %2;\n\t"
        " cvt.f32.f16 %0, t0;\n\t cvt.f32.f16 %1, t1; }" : "=f"(lo), "=f"(hi) : "r"(bits));
    return (float2)(lo, hi);
}
inline uint float2_to_halves(float lo, float hi)  // round to nearest even, as vstore_half_rte
{
    uint bits;
    asm("{ .reg .b16 t0, t1;\n\t cvt.rn.f16.f32 t0, %1;\n\t cvt.rn.f16.f32 t1, %2;\n\t"
        " mov.b32 %0, {t0, t1}; }" : "=r"(bits) : "f"(lo), "f"(hi));
    return bits;
}
<% words = [''] if VW == 2 else ['.s%x' % e for e in range(VW // 2)] %>
inline ${vec} ldv(const __global ${T} *p)
{
    const ${raw} r = *(const __global ${raw} *)p;
    return (${vec})(${', '.join('halves_to_float2(r%s)' % w for w in words)});
}
inline void stv(${vec} v, __global ${T} *p)
{
    *(__global ${raw} *)p = (${raw})(${', '.join(
        'float2_to_halves(v.s%x, v.s%x)' % (2 * e, 2 * e + 1) for e in range(VW // 2))});
}
%elif st.is_half:
inline ${vec} ldv(const __global ${T} *p) { return vload_half${'' if VW == 1 else VW}(0, p); }
inline void stv(${vec} v, __global ${T} *p) { vstore_half${'' if VW == 1 else VW}_rte(v, 0, p); }
%elif st.is_bf16 and VW == 1:
inline float ldv(const __global ushort *p) { return as_float((uint)*p << 16); }
inline void stv(float v, __global ushort *p) { *p = bf16_rte(v); }
%elif st.is_bf16:
## p is VW-aligned (as for float): the raw bits as 32-bit words (one 16-byte load for 8
## channels; a ushort vector there compiled to slower loads on NVIDIA: 0.27 ms against half's
## 0.17 ms at the paper's shape), each word two channels: the low half first (little-endian).
<% words = [''] if VW == 2 else ['.s%x' % e for e in range(VW // 2)] %>
inline ${vec} ldv(const __global ushort *p)
{
    const ${raw} r = *(const __global ${raw} *)p;
    return (${vec})(${', '.join('as_float(r%s << 16), as_float(r%s & 0xffff0000u)' % (w, w) for w in words)});
}
inline void stv(${vec} v, __global ushort *p) { *(__global ushort${VW} *)p = bf16_rte${VW}(v); }
%else:
inline ${vec} ldv(const __global ${T} *p) { return *(const __global ${vec} *)p; }
inline void stv(${vec} v, __global ${T} *p) { *(__global ${vec} *)p = v; }
%endif

inline float hsum(${vec} v) { return ${' + '.join('v' + c for c in comps)}; }

## ------------------------------------------------------------------ sampling positions
## The tap loop, in the official operator's order: i along the width outer, j along the
## height inner, the centre skipped under remove_center; k counts the taps that remain.
## Positions are computed as the official operator does, p0 - half*scale + (i*dil + dx)*scale,
## so float results agree with it to the rounding of each step.
<%def name="kernel_args()">
    const int H, const int W, const int H_out, const int W_out, const int P,
    const int stride_h, const int stride_w, const int pad_h, const int pad_w,
    const int dil_h, const int dil_w, const float offset_scale
</%def>
<%def name="position_setup()">
    const int Q = H_out * W_out;
    const int n = pix / Q, q = pix - n * Q;
    const int y = q / W_out, x = q - y * W_out;
${tap_origin()}
</%def>
## tap_origin: p0 and the offset_mask block of output pixel `pix` at row y, column x (the
## gather knows those without dividing).
<%def name="tap_origin()">
    const int half_w = (dil_w * (${kernel_w} - 1)) >> 1, half_h = (dil_h * (${kernel_h} - 1)) >> 1;
    const float p0_w = (float)(half_w - pad_w + x * stride_w) - (float)half_w * offset_scale;
    const float p0_h = (float)(half_h - pad_h + y * stride_h) - (float)half_h * offset_scale;
    // This (pixel, group)'s block of offset_mask: K (dx, dy) pairs, then K masks.
    const __global ${T} *om = offset_mask + pix * P + g * ${3 * K};
</%def>
<%def name="tap_loop_open(unroll=False)">
    int k = 0;
%if unroll:
    #pragma unroll
%endif
    for (int i = 0; i < ${kernel_w}; ++i) {
%if unroll:
        #pragma unroll
%endif
        for (int j = 0; j < ${kernel_h}; ++j) {
%if remove_center:
            if (i == ${kernel_w // 2} && j == ${kernel_h // 2}) continue;
%endif
</%def>
<%def name="tap_loop_close()">
            ++k;
        }
    }
</%def>
<%def name="tap_position(held=False)">
%if held:
            const float dx = omv[2 * k], dy = omv[2 * k + 1], m = omv[${2 * K} + k];
%else:
            const float dx = ${st.load('om', '2 * k')}, dy = ${st.load('om', '2 * k + 1')};
            const float m = ${st.load('om', '%d + k' % (2 * K))};
%endif
            const float w = p0_w + ((float)(i * dil_w) + dx) * offset_scale;
            const float h = p0_h + ((float)(j * dil_h) + dy) * offset_scale;
            // Also false for NaN and infinite positions: such taps count as outside.
            const int inside = h > -1.0f && w > -1.0f && h < (float)H && w < (float)W;
</%def>
<%def name="load_corners(c, chunk_stride=None)">
                ${vec} v[4];
                for (int t = 0; t < 4; ++t)
                    v[t] = idx[t] >= 0 ? ldv(in + idx[t] * ${GC} + ${c} * ${chunk_stride or VW}) : (${vec})(0.0f);
</%def>

%if direction == 'forward':
## ------------------------------------------------------------------ forward
## One work-item per (output pixel, group, run of CPW channels); consecutive work-items
## take consecutive channel runs, so a group's loads of one corner are contiguous.
__kernel void dcnv4_forward(__global const ${T} *restrict input,
                            __global const ${T} *restrict offset_mask,
                            __global ${T} *restrict output, const int items,
                            ${kernel_args()})
{
    const int gid = get_global_id(0);
    if (gid >= items) return;  // the NDRange is rounded up to whole work-groups
    const int slot = gid % ${SLOTS};
%if tile_rows:
    // Pixels in tiles of ${tile_rows} x ${tile_cols} (a work-group's pixels are neighbours in both
    // directions, so more of their taps' corners are the same lines of the SM's cache); tiles
    // along the row, then down, then the next image. Items past the output's edge stop here.
    const int tg = gid / ${SLOTS};
    const int g = tg % ${G}, t = tg / ${G};
    const int within = t % ${tile_rows * tile_cols}, tile = t / ${tile_rows * tile_cols};
    const int tiles_x = (W_out + ${tile_cols - 1}) / ${tile_cols};
    const int tiles_y = (H_out + ${tile_rows - 1}) / ${tile_rows};
    const int tx = tile % tiles_x, rest = tile / tiles_x;
    const int ty = rest % tiles_y, n = rest / tiles_y;
    const int y = ty * ${tile_rows} + within / ${tile_cols}, x = tx * ${tile_cols} + within % ${tile_cols};
    if (y >= H_out || x >= W_out) return;
    const int pix = (n * H_out + y) * W_out + x, pg = pix * ${G} + g;
${tap_origin()}
%else:
    const int pg = gid / ${SLOTS};
    const int g = pg % ${G}, pix = pg / ${G};
${position_setup()}
%endif
    const __global ${T} *in = input + n * (H * W * ${GC}) + g * ${C} + slot * ${SO};
    ${vec} acc[${NCH}];
    for (int c = 0; c < ${NCH}; ++c) acc[c] = (${vec})(0.0f);
%if reuse:
%if prefetch:
    // All of this (pixel, group)'s offsets and masks first, in registers (the tap loop is
    // unrolled, so k is a constant): their loads are in flight together, not one tap's at a
    // time behind the previous tap's corner loads.
    float omv[${3 * K}];
    #pragma unroll
    for (int e = 0; e < ${3 * K}; ++e) omv[e] = ${st.load('om', 'e')};
%endif
${tap_loop_open(prefetch)}
${tap_position(prefetch)}
            if (inside) {
                int idx[4]; float wt[4], lh, lw;
                bilinear_taps_float(h, w, H, W, idx, wt, &lh, &lw);
                for (int c = 0; c < ${NCH}; ++c) {
${load_corners('c', CS)}
                    acc[c] += m * (wt[0] * v[0] + wt[1] * v[1] + wt[2] * v[2] + wt[3] * v[3]);
                }
            }
${tap_loop_close()}
%else:
    for (int c = 0; c < ${NCH}; ++c) {
${tap_loop_open()}
${tap_position()}
            if (inside) {
                int idx[4]; float wt[4], lh, lw;
                bilinear_taps_float(h, w, H, W, idx, wt, &lh, &lw);
${load_corners('c', CS)}
                acc[c] += m * (wt[0] * v[0] + wt[1] * v[1] + wt[2] * v[2] + wt[3] * v[3]);
            }
${tap_loop_close()}
    }
%endif
    // The output's channels as the input's: this (pixel, group)'s block starts at pg * C.
    for (int c = 0; c < ${NCH}; ++c) stv(acc[c], output + pg * ${C} + slot * ${SO} + c * ${CS});
}

%else:
## ------------------------------------------------------------------ backward
## The input gradient is a scatter: a tap at a learned, data-dependent position adds to four
## input pixels, and which output pixels reach a given input pixel is unknown in general
## without sorting every tap by target. But a tap lands near its nominal place (its position
## with zero offset) unless its offset is large, and the output pixels whose taps are nominally
## near an input pixel are known: that is the gather's part. The ways, chosen per device:
##  - 'backward' (GPUs): one work-item per (pixel, group, slot of CPW channels) computes the
##    offset and mask gradients and, but for the gather, adds its taps with atomics.
##    scatter='gather' (the default) leaves the taps near their nominal place to
##    dcnv4_gather_input below, where each input pixel sums the taps that reach it in one order,
##    and adds only the far ones here, in 64-bit fixed point (common.cl.mako's fixed_point:
##    integer sums are the same whatever the order). scatter='fixed' adds every tap that way.
##    scatter='atomic' adds floats (the hardware's reduction on NVIDIA), as the official
##    operator does: the last bits then depend on the order in which work-items land.
##  - 'backward_owner' (CPUs, where a float atomic is a compare-and-swap loop, ~50x slower
##    than the arithmetic): one work-item owns the input gradient of one (image, group,
##    run of CPW channels) and walks every output pixel of that image in order: no atomics,
##    deterministic, and parallel enough for a CPU (N * G * C/CPW work-items).
## The offset and mask gradients are sums over a group's channels, always in a fixed order.
##
## The backward pass computes, per tap, with val = sum_t wt[t] v[t] (per channel):
##   d/d mask = sum_c go_c val_c,   d/d(dx, dy) = offset_scale * mask * sum_c go_c d val_c/d(w, h),
##   d/d input[corner t] += go_c * mask * wt[t].
## near_tap: whether a tap that counts lands within `margin` whole pixels of its nominal
## place (the integer position it has with zero offsets at offset_scale 1): such taps are
## gathered by dcnv4_gather_input, the others scattered. The verdict reaches the gather as a
## byte per tap (tap_codes), so every tap is taken by exactly one of the two kernels. With
## `weights` a near tap's four mask * weight products go with it (tap_weights, 16 bytes), and
## the gather reads one float per corner it adds; else it recomputes the tap's position by
## tap_position's expressions, without contraction, for the same weights.
<%def name="near_tap()">
                    const int fr = (int)floor(h) - (y * stride_h - pad_h + j * dil_h);
                    const int fc = (int)floor(w) - (x * stride_w - pad_w + i * dil_w);
                    const int near = fr >= ${-margin} && fr <= ${margin} && fc >= ${-margin} && fc <= ${margin};
</%def>
## fixed_terms: corner t's term `add` (channels c * CS on) into the fixed-point sums (gfix),
## non-finite parts into `side`; the scatter 'fixed' and the gather's far taps form it alike.
<%def name="fixed_terms()">
                            const int at = idx[t] * ${GC} + c * ${CS};
%for e_, comp in enumerate(comps):
                            fixed_add(gfix + at + ${e_}, side + at + ${e_}, add${comp}, s1, s2);
%endfor
</%def>
<%def name="tap_gradients(scatter)">
                    int idx[4]; float wt[4], lh, lw;
                    bilinear_taps_float(h, w, H, W, idx, wt, &lh, &lw);
%if scatter == 'gather':
${near_tap()}
%endif
                    for (int c = 0; c < ${NCH}; ++c) {
${load_corners('c', CS)}
                        const ${vec} val = wt[0] * v[0] + wt[1] * v[1] + wt[2] * v[2] + wt[3] * v[3];
                        const ${vec} dh = (1.0f - lw) * (v[2] - v[0]) + lw * (v[3] - v[1]);
                        const ${vec} dw = (1.0f - lh) * (v[1] - v[0]) + lh * (v[3] - v[2]);
                        sm += hsum(go[c] * val);
                        sh += hsum(go[c] * dh);
                        sw += hsum(go[c] * dw);
%if scatter != 'gather':
                        for (int t = 0; t < 4; ++t) {
                            if (idx[t] < 0) continue;
                            const ${vec} add = go[c] * (m * wt[t]);
%if scatter not in ('fixed', 'gather'):
                            __global float *dst = gin + idx[t] * ${GC} + c * ${CS};
%endif
%if scatter == 'atomic':
%for e, comp in enumerate(comps):
                            atomic_add_float(dst + ${e}, add${comp});
%endfor
%elif scatter == 'fixed':
${fixed_terms()}
%else:
                            *(__global ${vec} *)dst += add;  // this work-item owns dst
%endif
                        }
%endif
                    }
%if scatter == 'gather':
                    // A far tap: its corners are marked, and dcnv4_far_input adds it once their
                    // fixed-point sums are zeroed (only marked pixels' are, and read).
                    if (!near && slot == 0)
                        for (int t = 0; t < 4; ++t)
                            if (idx[t] >= 0) atomic_or(far + (n * H * W + idx[t]) * ${G} + g, 1u);
%endif
</%def>
<%def name="store_offset_gradients(target)">
                ${st.store('sw * scale', target, '2 * k')};
                ${st.store('sh * scale', target, '2 * k + 1')};
                ${st.store('sm', target, '%d + k' % (2 * K))};
</%def>
<%def name="zero_tail()">
        // Zeros in the padding tail of this pixel's offset_mask row: no separate fill pass.
        if (g == ${G - 1})
            for (int e = ${G * 3 * K}; e < P; ++e) ${st.store('0.0f', 'offset_mask_row', 'e')};
</%def>

%if direction == 'backward':
<% SP = slots_p2 %>
%if scatter == 'gather':
// tap_codes: per (output pixel, group, tap) a byte from dcnv4_backward for dcnv4_gather_input:
// FAR_TAP (outside the input, or farther than the margin: added in fixed point), else where
// the tap's floor corner lies from its nominal place, (row + margin) | (column + margin) << 4.
// Laid out by (image, group, tap), then output pixel: a tap's codes of neighbouring output
// pixels are neighbouring bytes, so the gather reads a row of its candidates' codes in two
// aligned words (the buffer has CODES_TAIL bytes beyond the last code for those reads).
#define FAR_TAP 0xFF
#define CODES_TAIL 8
#define CODE_AT(image, q, g, k) ((((image) * ${G} + (g)) * ${K} + (k)) * (H_out * W_out) + (q))
%endif
${common.atomic_add(info, 'float', force_cas=not ptx)}
%if FIXED:
${common.fixed_point(info, ptx)}
${common.fixed_to_storage(st)}

## The fixed-point scale's bound (common.cl.mako): the largest finite |grad_out| and |mask|,
## a flag for a non-finite one; this kernel also zeroes the fixed-point sums ('fixed') or the
## far marks ('gather': a uint per input pixel and group), so that the backward needs no
## separate fill. `bound` is zero on entry. A grid-stride loop, a local
## reduction, then one atomic max per work-group: the maxima do not depend on the order.
__kernel void fixed_bound(__global const ${T} *restrict grad_out, const int n_go,
                          __global const ${T} *restrict offset_mask, const int pix_groups,
                          const int P, __global uint *restrict bound,
%if scatter == 'gather':
                          __global uint *restrict sums, const int n_sums,
%else:
                          __global long *restrict sums, const int n_sums,
%endif
                          __local float *scratch)
{
    const int gid = get_global_id(0), stride = get_global_size(0);
    float a = 0.0f, b = 0.0f;
    uint bad = 0u;
    for (int i = gid; i < n_sums; i += stride) sums[i] = 0;
    for (int i = gid; i < n_go; i += stride) {
        const float v = fabs(${st.load('grad_out', 'i')});
        if (isfinite(v)) a = fmax(a, v); else bad = 1u;
    }
    for (int i = gid; i < pix_groups * ${K}; i += stride) {
        const int pg = i / ${K}, k = i - pg * ${K};
        const int pix = pg / ${G}, g = pg - pix * ${G};
        const float v = fabs(${st.load('offset_mask', 'pix * P + g * %d + %d + k' % (3 * K, 2 * K))});
        if (isfinite(v)) b = fmax(b, v); else bad = 1u;
    }
    const int lid = get_local_id(0);
    __local float *sa = scratch, *sb = scratch + get_local_size(0);
    __local uint *sbad = (__local uint *)(scratch + 2 * get_local_size(0));
    sa[lid] = a; sb[lid] = b; sbad[lid] = bad;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid == 0) {
        for (int l = 1; l < (int)get_local_size(0); ++l) {
            a = fmax(a, sa[l]); b = fmax(b, sb[l]); bad |= sbad[l];
        }
        atomic_max(bound, as_uint(a));
        atomic_max(bound + 1, as_uint(b));
        if (bad) atomic_or(bound + 2, 1u);
    }
}
%endif

## Work-items: (pixel, group, slot); with SP > 1 a group's slots are SP consecutive lanes of
## one work-group (the launcher makes the work-group size a multiple of SP) and their
## partial sums meet in local memory, double-buffered by tap parity: one barrier per tap.
__kernel void dcnv4_backward(__global const ${T} *restrict input,
                             __global const ${T} *restrict offset_mask,
                             __global const ${T} *restrict grad_out,
%if scatter == 'gather':
                             __global uint *far,
%elif FIXED:
                             __global long *restrict grad_fixed,
                             __global float *grad_side,
                             __global const uint *restrict bound,
                             const int terms_log2,
%else:
                             __global float *restrict grad_input,
%endif
                             __global ${T} *restrict grad_offset_mask,
%if scatter == 'gather':
                             __global uchar *restrict tap_codes,
%if weights:
                             __global float4 *restrict tap_weights,
%endif
%endif
                             const int pix_groups,
                             ${kernel_args()}
%if SP > 1:
                             , __local float *partial
%endif
                             )
{
    const int gid = get_global_id(0);
    const int slot = gid % ${SP};
    const int pg = gid / ${SP};
    // Padding work-items stay for the barriers but touch no memory.
    const int active = pg < pix_groups && slot < ${SLOTS};
    const int g = pg % ${G}, pix = active ? pg / ${G} : 0;
${position_setup()}
    const int in_base = n * (H * W * ${GC}) + g * ${C} + slot * ${SO};
    const __global ${T} *in = input + in_base;
%if scatter == 'fixed':
    volatile __global long *gfix = grad_fixed + in_base;
    volatile __global float *side = grad_side + in_base;
    const int e = fixed_exponent(bound, terms_log2);
    const float s1 = ldexp(1.0f, e / 2), s2 = ldexp(1.0f, e - e / 2);
%elif scatter != 'gather':
    __global float *gin = grad_input + in_base;
%endif
    __global ${T} *gom = grad_offset_mask + pix * P + g * ${3 * K};
    ${vec} go[${NCH}];
    for (int c = 0; c < ${NCH}; ++c)
        go[c] = active ? ldv(grad_out + pg * ${C} + slot * ${SO} + c * ${CS}) : (${vec})(0.0f);
%if SP > 1:
    const int lid = get_local_id(0), lsize = get_local_size(0);
%endif
%if prefetch:
    // As the forward's prefetch: the offsets and masks ahead of the unrolled tap loop.
    float omv[${3 * K}];
    #pragma unroll
    for (int e = 0; e < ${3 * K}; ++e) omv[e] = active ? ${st.load('om', 'e')} : 0.0f;
%endif
${tap_loop_open(prefetch)}
            // This work-item's share of d loss / d(w, h, mask) for tap k, and the factor
            // d(w, h)/d(dx, dy) * mask = offset_scale * mask that the (w, h) sums still need.
            float sw = 0.0f, sh = 0.0f, sm = 0.0f, scale = 0.0f;
%if scatter == 'gather':
            uchar code = FAR_TAP;
%endif
            if (active) {
${tap_position(prefetch)}
                scale = offset_scale * m;
                if (inside) {
${tap_gradients(scatter)}
%if scatter == 'gather':
                    if (near) {
                        code = (uchar)((fr + ${margin}) | ((fc + ${margin}) << 4));
%if weights:
                        // mask * weight of each corner, for the gather (its corner order).
                        if (slot == 0)
                            tap_weights[CODE_AT(n, q, g, k)] = (float4)(m * wt[0], m * wt[1], m * wt[2], m * wt[3]);
%endif
                    }
%endif
                }
            }
%if scatter == 'gather':
            if (active && slot == 0) tap_codes[CODE_AT(n, q, g, k)] = code;
%endif
%if SP > 1:
            __local float *buf = partial + (k & 1) * 3 * lsize;
            buf[3 * lid] = sw; buf[3 * lid + 1] = sh; buf[3 * lid + 2] = sm;
            barrier(CLK_LOCAL_MEM_FENCE);
            if (active && slot == 0) {
                sw = sh = sm = 0.0f;
                for (int s = 0; s < ${SLOTS}; ++s) {
                    sw += buf[3 * (lid + s)];
                    sh += buf[3 * (lid + s) + 1];
                    sm += buf[3 * (lid + s) + 2];
                }
            }
%endif
            if (active && slot == 0) {
${store_offset_gradients('gom')}
            }
${tap_loop_close()}
    if (active && slot == 0) {
        __global ${T} *offset_mask_row = grad_offset_mask + pix * P;
${zero_tail()}
    }
%if scatter == 'gather':
    // The codes' tail, read (and masked off) by the gather's word loads: defined bytes.
    if (gid < CODES_TAIL) tap_codes[pix_groups * ${K} + gid] = FAR_TAP;
%endif
}


%if scatter == 'gather':
<%
    NB = gather_cpw; NCB = NB // VW; SB = C // NB
    # The candidates' codes ahead of their visits: with prefetch, and always where their hit
    # mask fits a uint (margin <= 1), whose visits it speeds up with either storage (H100,
    # kernel events, 16-bit storage: the gather 0.464 against 0.593 ms at the paper's shape,
    # 0.217 against 0.294 at N=64 28x28, 0.123 against 0.153 at N=1 200x320).
    CODES_FIRST = prefetch or (2 * margin + 2) ** 2 <= 32
%>
## gather_visit: one candidate (output pixel `pix` at row y, column x; its tap code `code`)
## of tap (i, j) k: the term grad_out * mask * weight added if the tap has a corner at (r, col).
## code_place: the floor corner (h0, w0) of tap (i, j) of the output pixel at row `y`, column
## `x`, from its code (tap_codes).
<%def name="code_place(y, x)">
                    const int h0 = (code & 15) - ${margin} + ((${y}) * stride_h - pad_h + j * dil_h);
                    const int w0 = (code >> 4) - ${margin} + ((${x}) * stride_w - pad_w + i * dil_w);
</%def>
<%def name="gather_visit()">
                    if (code == FAR_TAP) continue;
${code_place('y', 'x')}
                    if ((r != h0 && r != h0 + 1) || (col != w0 && col != w0 + 1)) continue;
                    const int lower = r != h0, righter = col != w0;
${gather_body()}
</%def>
## gather_body: a candidate that has a corner at (r, col): `lower` (the corner is the tap's
## floor row + 1) and `righter` (floor column + 1) say which; its term added to acc.
<%def name="gather_body()">
%if weights:
                    // A corner of this pixel: its mask * weight as dcnv4_backward formed it (the
                    // corners in bilinear_taps' order), one load, not the position again.
                    const float mw = tap_weights_f[4 * CODE_AT(image, y * W_out + x, g, k)
                                                   + (lower ? 2 : 0) + (righter ? 1 : 0)];
%else:
                    // A corner of this pixel: the position again, by tap_position's expressions.
${tap_origin()}
                    const float dy = ${st.load('om', '2 * k + 1')}, dx = ${st.load('om', '2 * k')};
                    const float h = p0_h + ((float)(j * dil_h) + dy) * offset_scale;
                    const float w = p0_w + ((float)(i * dil_w) + dx) * offset_scale;
                    const float hf = floor(h), wf = floor(w);
                    const float m = ${st.load('om', '%d + k' % (2 * K))};
                    const float lh = h - hf, lw = w - wf;
                    // bilinear_taps' weight of this corner: (1 - lh or lh) * (1 - lw or lw)
                    const float wt = (lower ? lh : 1.0f - lh) * (righter ? lw : 1.0f - lw);
                    const float mw = m * wt;
%endif
                    const __global ${T} *gp = grad_out + (pix * ${G} + g) * ${C} + slot * ${NB};
                    for (int c = 0; c < ${NCB}; ++c) acc[c] += ldv(gp + c * ${VW}) * mw;
</%def>
inline int floor_div(const int a, const int b) { return a >= 0 ? a / b : -((b - 1 - a) / b); }

## Far taps (the gather's rest): dcnv4_backward marked the (input pixel, group)s their corners
## reach (`far`, a uint each). far_zero zeroes those pixels' fixed-point sums alone (and their
## side entries, where a non-finite term can exist: only far taps make such terms, so the
## other pixels' side entries are never read), and dcnv4_far_input adds the far taps there, in
## 64-bit fixed point, so the order does not matter: the same integer sums as if the first
## kernel had added them. Why not zero every
## sum and add them in the first kernel: the sums are 8 bytes per input channel, and with few
## far taps zeroing them all took 0.116 of the backward's 1.76 ms at the paper's shape on an
## H200 (float32), before the gather read them all again.
__kernel void far_zero(__global const uint *restrict far, __global long *restrict sums,
                       __global float *side, __global const uint *restrict bound, const int marks)
{
    const int i = get_global_id(0);
    if (i >= marks || !far[i]) return;
    // Mark i is input pixel i / G, group i % G: its sums are channels [i * C, i * C + C).
    for (int c = 0; c < ${C}; ++c) sums[i * ${C} + c] = 0;
    if (fixed_side_needed(bound))
        for (int c = 0; c < ${C}; ++c) side[i * ${C} + c] = 0.0f;
}

## Work-items as dcnv4_backward's, one per (output pixel, group, slot of CPW channels), without
## the padding to SP slots; the taps' codes say which are far, and nothing else is read for a
## (pixel, group) that has none.
__kernel void dcnv4_far_input(__global const ${T} *restrict offset_mask,
                              __global const uchar *restrict tap_codes,
                              __global const ${T} *restrict grad_out,
                              __global long *grad_fixed, __global float *grad_side,
                              __global const uint *restrict bound, const int terms_log2,
                              const int pix_groups,
                              ${kernel_args()})
{
    const int gid = get_global_id(0);
    const int slot = gid % ${SLOTS}, pg = gid / ${SLOTS};
    if (pg >= pix_groups) return;
    const int g = pg % ${G}, pix = pg / ${G};
${position_setup()}
    int any = 0;
    for (int e = 0; e < ${K}; ++e) any |= tap_codes[CODE_AT(n, q, g, e)] == FAR_TAP;
    if (!any) return;
    const int in_base = n * (H * W * ${GC}) + g * ${C} + slot * ${SO};
    volatile __global long *gfix = grad_fixed + in_base;
    volatile __global float *side = grad_side + in_base;
    const int e = fixed_exponent(bound, terms_log2);
    const float s1 = ldexp(1.0f, e / 2), s2 = ldexp(1.0f, e - e / 2);
    ${vec} go[${NCH}];
    for (int c = 0; c < ${NCH}; ++c) go[c] = ldv(grad_out + pg * ${C} + slot * ${SO} + c * ${CS});
${tap_loop_open()}
            // FAR_TAP is also an outside tap's code: the position again decides.
            if (tap_codes[CODE_AT(n, q, g, k)] == FAR_TAP) {
${tap_position()}
                if (inside) {
                    int idx[4]; float wt[4], lh, lw;
                    bilinear_taps_float(h, w, H, W, idx, wt, &lh, &lw);
                    for (int c = 0; c < ${NCH}; ++c)
                        for (int t = 0; t < 4; ++t) {
                            if (idx[t] < 0) continue;
                            // The term as the first kernel's scatter forms it (tap_gradients).
                            const ${vec} add = go[c] * (m * wt[t]);
${fixed_terms()}
                        }
                }
            }
${tap_loop_close()}
}

## The input gradient as a gather: work-item (input pixel, group, run of gather_cpw channels)
## visits every tap that could land near it (nominal place within margin + 1 pixels), in a
## fixed order, and adds grad_out * mask * weight (from dcnv4_backward's tap_weights, or the
## position recomputed) for each of the tap's corners that is this pixel: a float sum in
## one order, so the same bits on every run, with no atomics. Taps that dcnv4_backward found
## far from their nominal place were added in fixed point by dcnv4_far_input (grad_fixed, and
## grad_side for non-finite terms, read where `far` marks the pixel): they join here, and the
## sum is stored in the gradient's storage.
__kernel void dcnv4_gather_input(__global const ${T} *restrict offset_mask,
%if weights:
                                 __global const float4 *restrict tap_weights,
%endif
                                 __global const uchar *restrict tap_codes,
                                 __global const ${T} *restrict grad_out,
                                 __global const long *restrict grad_fixed,
                                 __global const float *grad_side,
                                 __global const uint *restrict bound, const int terms_log2,
                                 __global const uint *restrict far,
                                 __global ${T} *grad_input, const int items,
                                 ${kernel_args()})
{
    const int gid = get_global_id(0);
    if (gid >= items) return;
    const int slot = gid % ${SB}, rest = gid / ${SB};
    const int g = rest % ${G}, p = rest / ${G};         // p: input pixel of the whole batch
    const int image = p / (H * W), rem = p - image * (H * W);
    const int r = rem / W, col = rem - r * W;
%if weights:
    const __global float *tap_weights_f = (const __global float *)tap_weights;
%endif
    ${vec} acc[${NCB}];
    for (int c = 0; c < ${NCB}; ++c) acc[c] = (${vec})(0.0f);
${tap_loop_open()}
            // Output pixels whose tap (i, j) has its nominal row within margin + 1 of r (a
            // corner is the tap's floor row or the one below), likewise columns.
            const int oy0 = max(0, -floor_div(-(r - ${margin + 1} + pad_h - j * dil_h), stride_h));
            const int oy1 = min(H_out - 1, floor_div(r + ${margin} + pad_h - j * dil_h, stride_h));
            const int ox0 = max(0, -floor_div(-(col - ${margin + 1} + pad_w - i * dil_w), stride_w));
            const int ox1 = min(W_out - 1, floor_div(col + ${margin} + pad_w - i * dil_w, stride_w));
%if CODES_FIRST:
<% MR = 2 * margin + 2 %>
            // The candidates' codes first, all in flight together (at most ${MR} rows and columns
            // of them at any stride), then the same visits in the same order as below.
            uchar codes[${MR * MR}];
            #pragma unroll
            for (int a = 0; a < ${MR}; ++a) {
                const int oy = oy0 + a;
%if MR <= 5:
                // This row's codes from ox0 on: two aligned words hold them (byte `at` and the
                // next ${MR - 1}), a load each, not ${MR} byte loads.
                ulong row = 0;
                const int at = CODE_AT(image, oy * W_out + ox0, g, k);
                if (oy <= oy1) {
                    const __global uint *words = (const __global uint *)(tap_codes + (at & ~3));
                    row = (ulong)words[0] | ((ulong)words[1] << 32);
                }
                row >>= 8 * (at & 3);
                #pragma unroll
                for (int b = 0; b < ${MR}; ++b)
                    codes[a * ${MR} + b] = oy <= oy1 && ox0 + b <= ox1 ? (uchar)(row >> (8 * b)) : FAR_TAP;
%else:
                #pragma unroll
                for (int b = 0; b < ${MR}; ++b) {
                    const int ox = ox0 + b;
                    codes[a * ${MR} + b] = oy <= oy1 && ox <= ox1 ?
                        tap_codes[CODE_AT(image, oy * W_out + ox, g, k)] : FAR_TAP;
                }
%endif
            }
%if MR * MR <= 32:
            // Which candidates have a corner at this pixel, a bit each (no loads: the codes
            // alone say), then only those visited, lowest bit first: the order of the loops
            // below, so the same sums. Why: the candidates' hits differ from item to item, and
            // a loop over all of them runs each visit's body wherever one item of the warp
            // hits; here a warp runs as many bodies as its items have hits at most.
            uint hits = 0u, below = 0u, right = 0u;
            #pragma unroll
            for (int a = 0; a < ${MR}; ++a) {
                #pragma unroll
                for (int b = 0; b < ${MR}; ++b) {
                    const uchar code = codes[a * ${MR} + b];
${code_place('oy0 + a', 'ox0 + b')}
                    const uint bit = 1u << (a * ${MR} + b);
                    if (code != FAR_TAP && (r == h0 || r == h0 + 1) && (col == w0 || col == w0 + 1)) hits |= bit;
                    if (r != h0) below |= bit;
                    if (col != w0) right |= bit;
                }
            }
            while (hits) {
                const int e = 31 - clz(hits & (0u - hits));
                const uint bit = 1u << e;
                hits &= hits - 1u;
                const int y = oy0 + e / ${MR}, x = ox0 + e % ${MR}, pix = (image * H_out + y) * W_out + x;
                const int lower = (below & bit) != 0u, righter = (right & bit) != 0u;
${gather_body()}
            }
%else:
            #pragma unroll
            for (int a = 0; a < ${MR}; ++a) {
                #pragma unroll
                for (int b = 0; b < ${MR}; ++b) {
                    const int y = oy0 + a, x = ox0 + b, pix = (image * H_out + y) * W_out + x;
                    const uchar code = codes[a * ${MR} + b];
${gather_visit()}
                }
            }
%endif
%else:
            for (int oy = oy0; oy <= oy1; ++oy) {
                for (int ox = ox0; ox <= ox1; ++ox) {
                    const int pix = (image * H_out + oy) * W_out + ox, y = oy, x = ox;
                    // dcnv4_backward's verdict on this tap: far (or outside), or where its
                    // floor corner lies from the nominal place. Most candidates miss this pixel,
                    // and a byte per tap says so without the offsets (4-byte loads 3K apart).
                    const uchar code = tap_codes[CODE_AT(image, oy * W_out + ox, g, k)];
${gather_visit()}
                }
            }
%endif
${tap_loop_close()}
    // The far taps' fixed-point sums (and non-finite terms) join, then the storage's rounding.
    const int e = fixed_exponent(bound, terms_log2);
    const int side = fixed_side_needed(bound);
    const int at = p * ${GC} + g * ${C} + slot * ${NB};
    // Unmarked: no far tap reached the pixel, and its sums and side entries were not zeroed
    // (far_zero): their part is 0.0f, as fixed_value gives for zeroed ones.
    const int marked = far[p * ${G} + g] != 0u;
    for (int c = 0; c < ${NCB}; ++c) {
        ${vec} v = acc[c];
%for e_, comp in enumerate(comps):
        v${comp} += marked ? fixed_value(grad_fixed, grad_side, at + c * ${VW} + ${e_}, e, side) : 0.0f;
%endfor
        stv(v, grad_input + at + c * ${VW});
    }
}
%endif


%else:
## 'backward_owner': work-item (image n, group g, slot) zeroes its slice of the float
## gradient, accumulates every output pixel's taps into it in pixel order, and (16-bit
## storage) converts the slice at the end. With SLOTS > 1 each slot writes its partial
## offset/mask sums to `partial`, summed in slot order by reduce_offset_gradients.
__kernel void dcnv4_backward_owner(__global const ${T} *restrict input,
                                   __global const ${T} *restrict offset_mask,
                                   __global const ${T} *restrict grad_out,
                                   __global float *restrict grad_acc,
%if st.narrow:
                                   __global ${T} *restrict grad_input,
%endif
%if SLOTS > 1:
                                   __global float *restrict partial,
%else:
                                   __global ${T} *restrict grad_offset_mask,
%endif
                                   const int images_groups,
                                   ${kernel_args()})
{
    const int gid = get_global_id(0);
    const int slot = gid % ${SLOTS};
    const int ng = gid / ${SLOTS};
    if (ng >= images_groups) return;
    const int g = ng % ${G}, image = ng / ${G};
    const int in_base = image * (H * W * ${GC}) + g * ${C} + slot * ${CPW};
    const __global ${T} *in = input + in_base;
    __global float *gin = grad_acc + in_base;
    for (int p = 0; p < H * W; ++p)
        for (int c = 0; c < ${NCH}; ++c) *(__global ${vec} *)(gin + p * ${GC} + c * ${VW}) = (${vec})(0.0f);
    const int pixels = images_groups / ${G} * (H_out * W_out);  // N * H_out * W_out
    for (int pix = image * (H_out * W_out); pix < (image + 1) * (H_out * W_out); ++pix) {
${position_setup()}
        ${vec} go[${NCH}];
        for (int c = 0; c < ${NCH}; ++c) go[c] = ldv(grad_out + (pix * ${G} + g) * ${C} + slot * ${CPW} + c * ${VW});
%if SLOTS > 1:
        __global float *part = partial + (slot * pixels + pix) * ${G * 3 * K} + g * ${3 * K};
%else:
        __global ${T} *gom = grad_offset_mask + pix * P + g * ${3 * K};
%endif
${tap_loop_open()}
            float sw = 0.0f, sh = 0.0f, sm = 0.0f;
${tap_position()}
            const float scale = ${'1.0f' if SLOTS > 1 else 'offset_scale * m'};
            if (inside) {
${tap_gradients('owner')}
            }
%if SLOTS > 1:
            part[2 * k] = sw; part[2 * k + 1] = sh; part[${2 * K} + k] = sm;
%else:
${store_offset_gradients('gom')}
%endif
${tap_loop_close()}
%if SLOTS == 1:
        __global ${T} *offset_mask_row = grad_offset_mask + pix * P;
${zero_tail()}
%endif
    }
%if st.narrow:
    for (int p = 0; p < H * W; ++p)
        for (int c = 0; c < ${NCH}; ++c)
            stv(*(__global ${vec} *)(gin + p * ${GC} + c * ${VW}), grad_input + in_base + p * ${GC} + c * ${VW});
%endif
}

%if SLOTS > 1:
// Sum of the slots' partial offset/mask gradients, in slot order; zeros in P's padding tail.
__kernel void reduce_offset_gradients(__global const float *restrict partial,
                                      __global const ${T} *restrict offset_mask,
                                      __global ${T} *restrict grad_offset_mask, const int pixels,
                                      const int P, const float offset_scale)
{
    const int gid = get_global_id(0);
    if (gid >= pixels * P) return;
    const int pix = gid / P, e = gid - pix * P;
    if (e >= ${G * 3 * K}) { ${st.store('0.0f', 'grad_offset_mask', 'gid')}; return; }
    float s = 0.0f;
    for (int slot = 0; slot < ${SLOTS}; ++slot) s += partial[(slot * pixels + pix) * ${G * 3 * K} + e];
    // (dx, dy) entries still need offset_scale * mask: the mask sits at 2K + k of the group.
    const int g = e / ${3 * K}, r = e - g * ${3 * K};
    if (r < ${2 * K}) s *= offset_scale * ${st.load('offset_mask', 'pix * P + g * %d + %d + r / 2' % (3 * K, 2 * K))};
    ${st.store('s', 'grad_offset_mask', 'gid')};
}
%endif
%endif
%endif
