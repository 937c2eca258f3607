## Fused warp-affine preprocessing: bilinear warp (OpenCV's INTER_LINEAR + BORDER_CONSTANT),
## optional BGR->RGB swap, per-channel normalisation, planar output; or the warp alone (uint8 HWC).
##
## Parameters:
##   mode     'blob': float planar [N, 3, H, W] in storage `st`;  'hwc': uint8 [N, H, W, 3]
##   st       Storage of the blob (float32, float16 or bfloat16), None for 'hwc'
##   swap_rb  blob channel c is source channel 2 - c
##   vec      destination pixels per work-item, consecutive in a row, computed as one floatN
##            (dst_w % vec == 0). CPUs: 16, GPUs: 2 (fewer if dst_w is not a multiple).
##   fma      'fma', or '__builtin_fmaf' where the library fma is an opaque call (PoCL)
##   single   one image: its byte offset, geometry and matrix are scalar arguments (no table
##            to read or to upload); else a batch, described by one table
##   axis_aligned  the matrix has no rotation or shear (m1 = m3 = 0, a letterbox): the source
##            row is one scalar per work-item
##   word_loads    (little-endian CPUs) a corner's three channels from one 4-byte load;
##            every image spans at least 4 bytes (so all but 1x1 images)
##   packed_stores (CPUs) the blob's vectors stored by one unaligned store, not vstoren
##
## Images are packed in one byte buffer `src`. One image (single): it starts at byte src_off,
## has H rows of W pixels, `pitch` bytes from row to row and `step` bytes from pixel to pixel;
## d2i.s0-s5 is its destination-to-source matrix, in float. A batch: `table` holds 16 ints per
## image: n's bytes 64n .. 64n+7 are its byte offset (a ulong), then H, W, pitch, step, and the
## six matrix entries as float bits (4 unused). Its channels are consecutive bytes. The host
## has checked every offset, pitch and size against the buffer, that (H - 1) * pitch +
## (W - 1) * step + 3 fits an int, and that H, W < 2^22.
##
## The sampling has no per-pixel branches and no OpenCL library calls (floor, min, clamp,
## rint, convert_*, and on CPUs vloadn/vstoren): on PoCL each of those is an opaque call, and
## they kept its work-item loops scalar (2-3x slower); the selects cost GPUs nothing. The one
## branch, uniform per work-item, skips all reads when all its pixels are outside the image
## (letterbox bands): 37% off the 1080p -> 640x640 kernel on PoCL.
## common.bilinear_taps is not used: it calls floor (above), and its product weights are zero
## for corners outside the image, whereas OpenCV gives outside corners the border value and
## their full weight, in a lerp of lerps -- the order of rounding that makes results identical.
<%
    V = 'float' if vec == 1 else 'float%d' % vec
    VI = 'int' if vec == 1 else 'int%d' % vec
    VU = 'uint' if vec == 1 else 'uint%d' % vec

    def lane(name, k):
        return name if vec == 1 else '%s.s%x' % (name, k)

    def lanes(fn, T=V):
        """A vector of type T (floatN) built lane by lane from fn(k), a scalar expression."""
        return fn(0) if vec == 1 else '(%s)(%s)' % (T, ', '.join(fn(k) for k in range(vec)))

    def FMA(a, b, c):
        """Fused multiply-add of three variables (one rounding, as OpenCV's v_fma)."""
        if vec == 1 or fma != '__builtin_fmaf':
            return '%s(%s, %s, %s)' % (fma, a, b, c)
        return lanes(lambda k: '__builtin_fmaf(%s, %s, %s)' % (lane(a, k), lane(b, k), lane(c, k)))

    def word(p):
        """The 4 bytes at p as one load, p of any alignment (separate byte loads stay separate)."""
        return '((__global const unaligned_uint *)(%s))->v' % p

    ramp = '0.0f' if vec == 1 else '(%s)(%s)' % (V, ', '.join('%d.0f' % k for k in range(vec)))
%>
// OpenCL contracts a*b+c into fma by default; the rounding below must be exactly the one
// OpenCV performs, so every fused multiply-add is written out and nothing else is fused.
#pragma OPENCL FP_CONTRACT OFF
${st.helpers() if st is not None else ''}
// x + 1.5 * 2^23 - 1.5 * 2^23 rounds x to an integer, half to even, for |x| < 2^22; the
// bits of x + 1.5 * 2^23 then hold that integer plus 0x4B400000.
#define ROUND_MAGIC 12582912.0f
#define ROUND_MAGIC_BITS 0x4B400000
// Members of packed structs have alignment 1: loads and stores of any address, in one
// instruction where the device has them (vloadn/vstoren are library calls on PoCL).
%if word_loads:
typedef struct __attribute__((packed)) { uint v; } unaligned_uint;
%endif
%if packed_stores and mode == 'blob' and not st.narrow and vec > 1:
typedef struct __attribute__((packed)) { ${V} v; } unaligned_${V};
%endif

<%def name="sample(levels)">
    // OpenCV's order (imgproc/src/warp_kernels.simd.hpp, OpenCV >= 4.11): the row term
    // y*m1 + m2 rounded twice (no fma), then one fma in x.
    const ${V} xf = (${V})((float)x) + ${ramp};
%if axis_aligned:
    // m1 = m3 = 0 (a letterbox): y*m1 + m2 is m2 and fma(m3, x, ry) is ry, exactly, so the
    // source row is one scalar for all lanes.
    const ${V} mx = (${V})(m0), rx = (${V})(m2);
    const ${V} sx = ${FMA('mx', 'xf', 'rx')};
    const float sy = (float)y * m4 + m5;
    const ${VI} inside = sx > -1.0f && sx < (float)W && (sy > -1.0f && sy < (float)H);
%else:
    const ${V} mx = (${V})(m0), my = (${V})(m3);
    const ${V} rx = (${V})((float)y * m1 + m2), ry = (${V})((float)y * m4 + m5);
    const ${V} sx = ${FMA('mx', 'xf', 'rx')}, sy = ${FMA('my', 'xf', 'ry')};
    // Fully outside -- which also catches NaN and infinities -- is the border value;
    // sx == -1 exactly would blend only weight-0 image taps, so it is the border too.
    const ${VI} inside = sx > -1.0f && sx < (float)W && sy > -1.0f && sy < (float)H;
%endif
%for c in range(3):
    ${V} ${levels}${c} = (${V})(border${c});
%endfor
    // Letterbox bands and rotated corners: nothing to read (a uniform branch per work-item).
    if (${' || '.join(lane('inside', k) for k in range(vec))}) {
<% Y, YI = ('float', 'int') if axis_aligned else (V, VI) %>
        // floor(p) for -1 < p < 2^22: round to nearest, then step down where that went up.
        const ${V} px = inside ? sx : (${V})(0.0f);
        const ${V} rpx = (px + ROUND_MAGIC) - ROUND_MAGIC;
        const ${V} fx = rpx - (rpx > px ? (${V})(1.0f) : (${V})(0.0f));
        const ${VI} ix = as_${VI}(fx + ROUND_MAGIC) - ROUND_MAGIC_BITS;
        const ${V} ax = px - fx;
%if axis_aligned:
        const float py = sy;   // inside the image's rows, or no lane would be inside
%else:
        const ${V} py = inside ? sy : (${V})(0.0f);
%endif
        const ${Y} rpy = (py + ROUND_MAGIC) - ROUND_MAGIC;
        const ${Y} fy = rpy - (rpy > py ? (${Y})(1.0f) : (${Y})(0.0f));
        const ${YI} iy = as_${YI}(fy + ROUND_MAGIC) - ROUND_MAGIC_BITS;
        const ${V} ay = (${V})(py - fy);
        // Corners outside the image take the border value; the loads always read a clamped,
        // valid address, so that no load depends on a branch.
        const ${VI} in_x0 = ix >= 0, in_x1 = ix + 1 < W;
        const ${YI} in_y0 = iy >= 0, in_y1 = iy + 1 < H;
        const ${VI} col0 = (in_x0 ? ix : (${VI})(0)) * step, col1 = (in_x1 ? ix + 1 : (${VI})(W - 1)) * step;
        const ${YI} row0 = (in_y0 ? iy : (${YI})(0)) * pitch, row1 = (in_y1 ? iy + 1 : (${YI})(H - 1)) * pitch;
        const ${VI} a00 = row0 + col0, a01 = row0 + col1, a10 = row1 + col0, a11 = row1 + col1;
        const ${VI} k00 = in_y0 && in_x0, k01 = in_y0 && in_x1, k10 = in_y1 && in_x0, k11 = in_y1 && in_x1;
%if word_loads:
        // A corner's three channels from one 4-byte load ending at its last byte (little
        // endian: channel c is bits 8c+8 .. 8c+15), so that no load reads past the image. The
        // image's first pixel has no byte before it: it is read from its own first byte (the
        // image spans 4 bytes or more) and shifted up into place.
<%def name="load(t)">{
            const ${VI} s = a${t} > 0 ? a${t} - 1 : (${VI})(0);
            const ${VU} w = ${lanes(lambda k: word('img + ' + lane('s', k)), VU)};
            w${t} = a${t} > 0 ? w : w << 8;
        }</%def>
        ${VU} w00, w01, w10, w11;
        ${load('00')}
%if axis_aligned:
        // A corner of weight zero is not read: fma(0, d, p) is p for the finite levels here,
        // so any level there gives OpenCV's result. Integer source columns in every lane (ax
        // == 0) skip the second column, an integer source row (ay == 0) the second row; a
        // 1/3 downscale of 1080p has both, one load per pixel instead of four.
        const int whole_x = ${' && '.join(lane('ax', k) + ' == 0.0f' for k in range(vec))};
        if (whole_x) w01 = w00; else ${load('01')}
        if (py == fy) {
            w10 = w00;
            w11 = w01;
        } else {
            ${load('10')}
            if (whole_x) w11 = w10; else ${load('11')}
        }
%else:
        ${load('01')}
        ${load('10')}
        ${load('11')}
%endif
%endif
%for c in range(3):
        {
            const ${V} b = (${V})(border${c});
%for t in ('00', '01', '10', '11'):
%if word_loads:
            // The level as float: OR-ed into the mantissa of 2^23, less 2^23; exact, and no
            // library call (see above).
            const ${V} p${t} = k${t} ? as_${V}(((w${t} >> ${8 * c + 8}) & 0xFFu) | 0x4B000000u) - 8388608.0f : b;
%else:
            const ${V} p${t} = k${t} ? ${lanes(lambda k: '(float)img[%s + %d]' % (lane('a' + t, k), c))} : b;
%endif
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
%if single:
    __global const uchar *img = src + src_off;
    const float m0 = d2i.s0, m1 = d2i.s1, m2 = d2i.s2, m3 = d2i.s3, m4 = d2i.s4, m5 = d2i.s5;
%else:
    __global const int *t = table + 16 * n;
    __global const uchar *img = src + *(__global const ulong *)t;
    const int H = t[2], W = t[3], pitch = t[4], step = t[5];
    const float m0 = as_float(t[6]), m1 = as_float(t[7]), m2 = as_float(t[8]);
    const float m3 = as_float(t[9]), m4 = as_float(t[10]), m5 = as_float(t[11]);
%endif
</%def>

<%
    if single:
        args = ("__global const uchar *src, const ulong src_off, const int H, const int W, "
                "const int pitch, const int step, const float8 d2i")
    else:
        args = "__global const uchar *src, __global const int *table"
%>
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
%if not packed_stores or st.narrow or vec == 1:
        ${st.storen(vec, 'value', '(o + %d * plane)' % c, '0')};
%else:
        // One vector store (vstoren is a library call on PoCL), unaligned: the output may be
        // a caller's numpy array, aligned to its elements only.
        ((__global unaligned_${V} *)(o + ${c} * plane))->v = value;
%endif
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
