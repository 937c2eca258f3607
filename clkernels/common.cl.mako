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
