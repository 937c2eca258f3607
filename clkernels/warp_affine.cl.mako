## Fused warp-affine preprocessing: bilinear warp (OpenCV's INTER_LINEAR + BORDER_CONSTANT),
## optional BGR->RGB swap, per-channel normalisation, planar output; or the warp alone (uint8 HWC).
##
## Parameters:
##   mode     'blob': float planar [N, 3, H, W] in storage `st`;  'hwc': uint8 [N, H, W, 3]
##   st       Storage of the blob (float32 or float16), None for 'hwc'
##   swap_rb  blob channel c is source channel 2 - c
##   vec      destination pixels per work-item, consecutive in a row, computed as one floatN
##            (dst_w % vec == 0). CPUs: 8, GPUs: 2 (fewer if dst_w is not a multiple).
##   fma      'fma', or '__builtin_fmaf' where the library fma is an opaque call (PoCL)
##
## Images are packed in one byte buffer: image n starts at byte img_off[n] and has
## img_geom[4n .. 4n+3] = (height, width, row pitch in bytes, pixel step in bytes); its
## channels are consecutive bytes. img_d2i[6n .. 6n+5] is its destination-to-source matrix,
## in float. The host has checked every offset, pitch and size against the buffer, that
## (H - 1) * pitch + (W - 1) * step + 3 fits an int, and that H, W < 2^22.
##
## The sampling has no per-pixel branches and no OpenCL library calls (floor, min, clamp,
## rint, convert_*): on PoCL each of those is an opaque call, and they kept its work-item
## loops scalar (2-3x slower); the selects cost GPUs nothing. The one branch, uniform per
## work-item, skips all reads when all its pixels are outside the image (letterbox bands):
## 37% off the 1080p -> 640x640 kernel on PoCL.
## common.bilinear_taps is not used: it calls floor (above), and its product weights are zero
## for corners outside the image, whereas OpenCV gives outside corners the border value and
## their full weight, in a lerp of lerps -- the order of rounding that makes results identical.
<%
    V = 'float' if vec == 1 else 'float%d' % vec
    VI = 'int' if vec == 1 else 'int%d' % vec

    def lane(name, k):
        return name if vec == 1 else '%s.s%x' % (name, k)

    def lanes(fn):
        """A floatN built lane by lane from fn(k), a scalar expression."""
        return fn(0) if vec == 1 else '(%s)(%s)' % (V, ', '.join(fn(k) for k in range(vec)))

    def FMA(a, b, c):
        """Fused multiply-add of three variables (one rounding, as OpenCV's v_fma)."""
        if vec == 1 or fma != '__builtin_fmaf':
            return '%s(%s, %s, %s)' % (fma, a, b, c)
        return lanes(lambda k: '__builtin_fmaf(%s, %s, %s)' % (lane(a, k), lane(b, k), lane(c, k)))

    ramp = '0.0f' if vec == 1 else '(%s)(%s)' % (V, ', '.join('%d.0f' % k for k in range(vec)))
%>
// OpenCL contracts a*b+c into fma by default; the rounding below must be exactly the one
// OpenCV performs, so every fused multiply-add is written out and nothing else is fused.
#pragma OPENCL FP_CONTRACT OFF
// x + 1.5 * 2^23 - 1.5 * 2^23 rounds x to an integer, half to even, for |x| < 2^22; the
// bits of x + 1.5 * 2^23 then hold that integer plus 0x4B400000.
#define ROUND_MAGIC 12582912.0f
#define ROUND_MAGIC_BITS 0x4B400000

<%def name="sample(levels)">
    // OpenCV's order (imgproc/src/warp_kernels.simd.hpp, OpenCV >= 4.11): the row term
    // y*m1 + m2 rounded twice (no fma), then one fma in x.
    const ${V} mx = (${V})(m[0]), my = (${V})(m[3]);
    const ${V} rx = (${V})((float)y * m[1] + m[2]), ry = (${V})((float)y * m[4] + m[5]);
    const ${V} xf = (${V})((float)x) + ${ramp};
    const ${V} sx = ${FMA('mx', 'xf', 'rx')}, sy = ${FMA('my', 'xf', 'ry')};
    // Fully outside -- which also catches NaN and infinities -- is the border value;
    // sx == -1 exactly would blend only weight-0 image taps, so it is the border too.
    const ${VI} inside = sx > -1.0f && sx < (float)W && sy > -1.0f && sy < (float)H;
%for c in range(3):
    ${V} ${levels}${c} = (${V})(border${c});
%endfor
    // Letterbox bands and rotated corners: nothing to read (a uniform branch per work-item).
    if (${' || '.join(lane('inside', k) for k in range(vec))}) {
        const ${V} px = inside ? sx : (${V})(0.0f), py = inside ? sy : (${V})(0.0f);
        // floor(p) for -1 < p < 2^22: round to nearest, then step down where that went up.
        const ${V} rpx = (px + ROUND_MAGIC) - ROUND_MAGIC, rpy = (py + ROUND_MAGIC) - ROUND_MAGIC;
        const ${V} fx = rpx - (rpx > px ? (${V})(1.0f) : (${V})(0.0f));
        const ${V} fy = rpy - (rpy > py ? (${V})(1.0f) : (${V})(0.0f));
        const ${VI} ix = as_${VI}(fx + ROUND_MAGIC) - ROUND_MAGIC_BITS;
        const ${VI} iy = as_${VI}(fy + ROUND_MAGIC) - ROUND_MAGIC_BITS;
        const ${V} ax = px - fx, ay = py - fy;
        // Corners outside the image take the border value; the loads always read a clamped,
        // valid address, so that no load depends on a branch.
        const ${VI} in_x0 = ix >= 0, in_x1 = ix + 1 < W, in_y0 = iy >= 0, in_y1 = iy + 1 < H;
        const ${VI} col0 = (in_x0 ? ix : (${VI})(0)) * step, col1 = (in_x1 ? ix + 1 : (${VI})(W - 1)) * step;
        const ${VI} row0 = (in_y0 ? iy : (${VI})(0)) * pitch, row1 = (in_y1 ? iy + 1 : (${VI})(H - 1)) * pitch;
        const ${VI} a00 = row0 + col0, a01 = row0 + col1, a10 = row1 + col0, a11 = row1 + col1;
        const ${VI} k00 = in_y0 && in_x0, k01 = in_y0 && in_x1, k10 = in_y1 && in_x0, k11 = in_y1 && in_x1;
%for c in range(3):
        {
            const ${V} b = (${V})(border${c});
%for t in ('00', '01', '10', '11'):
            const ${V} p${t} = k${t} ? ${lanes(lambda k: '(float)img[%s + %d]' % (lane('a' + t, k), c))} : b;
%endfor
            const ${V} d0 = p01 - p00, d1 = p11 - p10;
            const ${V} f0 = ${FMA('ax', 'd0', 'p00')}, f1 = ${FMA('ax', 'd1', 'p10')};
            const ${V} e = f1 - f0;
            const ${V} v = inside ? ${FMA('ay', 'e', 'f0')} : b;
            // OpenCV's result is a uint8 image: round half to even. v lies in [0, 255] (a
            // convex blend of levels), so no clamp is needed.
            ${levels}${c} = (v + ROUND_MAGIC) - ROUND_MAGIC;
        }
%endfor
    }
</%def>

<%def name="prologue()">
    const int gx = get_global_id(0), y = get_global_id(1), n = get_global_id(2);
    const int x = gx * ${vec};
    if (x >= dst_w || y >= dst_h)
        return;  // the launch grid is rounded up to whole work-groups
    const int H = img_geom[4 * n], W = img_geom[4 * n + 1];
    const int pitch = img_geom[4 * n + 2], step = img_geom[4 * n + 3];
    __global const uchar *img = src + img_off[n];
    __global const float *m = img_d2i + 6 * n;
</%def>

<% args = ("__global const uchar *src, __global const ulong *img_off, "
           "__global const int *img_geom, __global const float *img_d2i") %>
%if mode == 'blob':
## blob channel c <- source channel ch[c]
<% ch = (2, 1, 0) if swap_rb else (0, 1, 2) %>
__kernel void letterbox_blob(
    ${args}, __global ${st.ptr} *out,
    const int dst_w, const int dst_h, const int n_first,
    const float border0, const float border1, const float border2,
    const float scale0, const float scale1, const float scale2,
    const float shift0, const float shift1, const float shift2)
{
    ${prologue()}
    ${sample('level')}
    const size_t plane = (size_t)dst_h * dst_w;
    __global ${st.ptr} *o = out + (size_t)(n_first + n) * 3 * plane + (size_t)y * dst_w + x;
%for c in range(3):
    {
        const ${V} k = (${V})(scale${c}), s = (${V})(shift${c});
        const ${V} value = ${FMA('level%d' % ch[c], 'k', 's')};
        ${st.storen(vec, 'value', '(o + %d * plane)' % c, '0')};
    }
%endfor
}
%else:
__kernel void warp_hwc(
    ${args}, __global uchar *out,
    const int dst_w, const int dst_h, const int n_first,
    const float border0, const float border1, const float border2)
{
    ${prologue()}
    ${sample('level')}
    __global uchar *o = out + (((size_t)(n_first + n) * dst_h + y) * dst_w + x) * 3;
%for k in range(vec):
%for c in range(3):
    o[${3 * k + c}] = (uchar)${lane('level%d' % c, k)};  // an integer in [0, 255]
%endfor
%endfor
}
%endif
