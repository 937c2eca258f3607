## Device code shared by every kernel, written once. Include it with
##   <%namespace name="common" file="/clkernels/common.cl.mako"/>
## and emit what a kernel needs: ${common.fp64_pragma()}, ${common.atomic_add(info, 'float')},
## ${common.bilinear_taps('float')}. Each def emits plain OpenCL C 1.2.

<%def name="fp64_pragma()">
#if defined(cl_khr_fp64)
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
</%def>

## atomic_add_<real>(volatile __global real *p, real v): OpenCL 1.2 has no float atomic add.
## NVIDIA: the hardware's reduction instruction through inline PTX (its OpenCL compiler
## accepts asm); everyone else: a compare-and-swap loop on the bit pattern. float64 needs
## 64-bit atomics (cl_khr_int64_base_atomics).
<%def name="atomic_add(info, real='float', force_cas=False)">
%if real == 'double':
#pragma OPENCL EXTENSION cl_khr_int64_base_atomics : enable
%endif
<% uint = 'ulong' if real == 'double' else 'uint' %>
<% cmpxchg = 'atom_cmpxchg' if real == 'double' else 'atomic_cmpxchg' %>
void atomic_add_${real}(volatile __global ${real} *p, ${real} v)
{
%if info.vendor == 'nvidia' and not force_cas:
    asm volatile("red.global.add.${'f64' if real == 'double' else 'f32'} [%0], %1;"
                 :: "l"(p), "${'d' if real == 'double' else 'f'}"(v) : "memory");
%else:
    volatile __global ${uint} *bits = (volatile __global ${uint} *)p;
    // Start from a guess of 0 instead of a plain read: the first exchange returns the real
    // value when the guess is wrong, and a plain read beside atomics would be a data race.
    ${uint} seen = 0;
    for (;;) {
        const ${uint} next = as_${uint}(as_${real}(seen) + v);
        const ${uint} was = ${cmpxchg}(bits, seen, next);
        if (was == seen) break;
        seen = was;  // lost a race: retry on the value that won
    }
%endif
}
</%def>

## bilinear_taps_<real>(h, w, H, W, idx, wt, &lh, &lw): the four corners of pixel position
## (h, w) in an H x W row-major map, ordered (h0,w0) (h0,w0+1) (h0+1,w0) (h0+1,w0+1).
## idx[k] = row-major offset, or -1 for a corner outside the map (which then reads as zero
## and gets weight 0). lh, lw are the fractional parts needed by gradients:
##   d/dh = (1-lw)(v2-v0) + lw(v3-v1),   d/dw = (1-lh)(v1-v0) + lh(v3-v2).
## The caller must first check -1 < h < H and -1 < w < W: that test also rejects NaN, so no
## NaN or huge value ever reaches the int conversion here.
<%def name="bilinear_taps(real='float')">
void bilinear_taps_${real}(${real} h, ${real} w, int H, int W,
                           int *idx, ${real} *wt, ${real} *lh_out, ${real} *lw_out)
{
    const ${real} hf = floor(h), wf = floor(w);
    const int h0 = (int)hf, w0 = (int)wf;
    const ${real} lh = h - hf, lw = w - wf;
    const ${real} hh = (${real})1 - lh, hw = (${real})1 - lw;
    const int top = h0 >= 0, bottom = h0 + 1 <= H - 1;
    const int left = w0 >= 0, right = w0 + 1 <= W - 1;
    idx[0] = (top && left) ? h0 * W + w0 : -1;
    idx[1] = (top && right) ? h0 * W + w0 + 1 : -1;
    idx[2] = (bottom && left) ? (h0 + 1) * W + w0 : -1;
    idx[3] = (bottom && right) ? (h0 + 1) * W + w0 + 1 : -1;
    wt[0] = idx[0] >= 0 ? hh * hw : (${real})0;
    wt[1] = idx[1] >= 0 ? hh * lw : (${real})0;
    wt[2] = idx[2] >= 0 ? lh * hw : (${real})0;
    wt[3] = idx[3] >= 0 ? lh * lw : (${real})0;
    *lh_out = lh;
    *lw_out = lw;
}
</%def>

## Deterministic scatter-add: sums in 64-bit fixed point. Integer addition is associative, so
## the sum's bits do not depend on the order in which work-items land, unlike float atomics.
## The scale 2^e is chosen on the device from a bound on every sum: with |term| <= a*b and at
## most 2^terms_log2 terms per sum, |sum| <= a*b*2^terms_log2, and e puts that at 2^61 (each
## term's rounding adds at most 1/2, so no sum reaches 2^63). A sum then keeps about
## 61 - terms_log2 bits below the largest term's size (float32 keeps 24), and the conversion
## back rounds once. `bound` holds (a, b) as float bits (atomic_max on the bits of
## non-negative floats orders them as floats) and a flag for a non-finite factor.
## Terms that are not finite (a NaN or infinite factor, or a product past FLT_MAX) cannot be
## fixed-point: they go to a float `side` buffer with float atomics, where inf + -inf = NaN
## and NaN absorbs everything in any order, so that part is order-free too. The side buffer is
## zeroed and read only when fixed_side_needed says such a term can exist.
##   fixed_exponent(bound, terms_log2) -> e;  fixed_add(p, side, v, s1, s2): p += v * 2^e
##   (s1 * s2 = 2^e, two factors so that |e| up to 252 stays within float's range).
<%def name="fixed_point(info, ptx=False)">
#pragma OPENCL EXTENSION cl_khr_int64_base_atomics : enable
inline int fixed_exponent(__global const uint *bound, const int terms_log2)
{
    const float a = as_float(bound[0]), b = as_float(bound[1]);
    if (!(a > 0.0f) || !(b > 0.0f)) return 0;   // every finite term is 0: any scale is exact
    // a < 2^(ilogb(a) + 1), likewise b.
    return clamp(61 - (ilogb(a) + 1) - (ilogb(b) + 1) - terms_log2, -252, 252);
}
inline int fixed_side_needed(__global const uint *bound)
{
    const float a = as_float(bound[0]), b = as_float(bound[1]);
    // A product of two finite factors can overflow only when their exponents sum past 127.
    return bound[2] != 0u || (a > 0.0f && b > 0.0f && ilogb(a) + ilogb(b) >= 126);
}
// Element i of the sums as float, plus its side part where one can exist (`side_needed`:
// fixed_side_needed's answer). The conversion from long rounds to nearest even once; the
// power-of-two scaling is exact.
inline float fixed_value(__global const long *sums, __global const float *side, const int i,
                         const int e, const int side_needed)
{
    const float v = ldexp(convert_float_rte(sums[i]), -e);
    return side_needed ? v + side[i] : v;
}
inline void fixed_add_bits(volatile __global long *p, const long q)
{
%if info.vendor == 'nvidia' and ptx:
    asm volatile("red.global.add.u64 [%0], %1;" :: "l"(p), "l"(q) : "memory");
%else:
    atom_add(p, q);
%endif
}
inline void fixed_add(volatile __global long *p, volatile __global float *side, const float v,
                      const float s1, const float s2)
{
    if (!isfinite(v)) { atomic_add_float(side, v); return; }
    fixed_add_bits(p, convert_long_rte((v * s1) * s2));
}
</%def>

## fixed_to_storage: fixed_value of every element, stored in `dst` (side and dst may be the
## same float buffer).
<%def name="fixed_to_storage(st)">
__kernel void fixed_to_storage(__global const long *restrict acc, __global const uint *restrict bound,
                               __global const float *side, __global ${st.ptr} *dst, const int n,
                               const int terms_log2)
{
    const int i = get_global_id(0);
    if (i >= n) return;
    const float v = fixed_value(acc, side, i, fixed_exponent(bound, terms_log2), fixed_side_needed(bound));
    ${st.store('v', 'dst', 'i')};
}

// Zeroes the side buffer when a non-finite term can exist (see fixed_point); a no-op otherwise.
__kernel void fixed_side_fill(__global const uint *restrict bound, __global float *side, const int n)
{
    if (!fixed_side_needed(bound)) return;
    for (int i = get_global_id(0); i < n; i += get_global_size(0)) side[i] = 0.0f;
}
</%def>
