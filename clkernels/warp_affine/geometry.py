"""The letterbox's geometry: its image-to-blob matrix, the inverse of an affine matrix (what the
kernel samples with) and the mapping of detections back to the images."""
from __future__ import annotations

from typing import Tuple

import numpy as np



def letterbox_matrix(src_size: Tuple[int, int], dst_size: Tuple[int, int]) -> np.ndarray:
    """The image-to-blob matrix ``i2d`` (2x3, float64) of a centred letterbox.

    ``src_size`` and ``dst_size`` are ``(width, height)``. The scale is
    ``s = min(dst_w / src_w, dst_h / src_h)``; the ``s/2 - 1/2`` terms make it map pixel
    centres to pixel centres, so the image covers ``s * src`` pixels in the middle.
    """
    (sw, sh), (dw, dh) = src_size, dst_size
    s = min(dw / sw, dh / sh)
    return np.array([[s, 0.0, -s * sw / 2 + dw / 2 + s / 2 - 0.5],
                     [0.0, s, -s * sh / 2 + dh / 2 + s / 2 - 0.5]])


def invert_affine(M: np.ndarray, name: str) -> np.ndarray:
    """The inverse of a 2x3 affine matrix, in float64; a singular one is an error. NaN
    entries are allowed: they give a NaN inverse, which samples the border everywhere."""
    a, b, c = (float(v) for v in M[0])
    d, e, f = (float(v) for v in M[1])
    det = a * e - b * d
    if det == 0:
        raise ValueError(f"{name} is singular (its 2x2 part has determinant 0): {M.tolist()}; "
                         "an affine warp needs an invertible matrix")
    # The same operations, in the same order, as OpenCV's inversion inside warpAffine, so
    # that both round to the same float matrix.
    r = 1.0 / det
    a11, a12, a21, a22 = e * r, -b * r, -d * r, a * r
    return np.array([[a11, a12, -a11 * c - a12 * f], [a21, a22, -a21 * c - a22 * f]])


def scale_boxes(boxes, d2i, shape=None) -> np.ndarray:
    """Map boxes found on the blob back to the source image.

    ``boxes``: ``[..., 4]`` as ``x1, y1, x2, y2`` in continuous pixel coordinates of the blob
    (pixel ``i`` covers ``[i, i + 1)``, the convention detectors predict in). ``d2i``: the
    2x3 matrix ``letterbox`` returned for that image. Returns float64 boxes in source pixel
    coordinates: the blob area covered by the image maps to ``[0, 0, src_w, src_h]``. For a
    matrix with rotation the result is the axis-aligned box around the four mapped corners.
    ``shape=(height, width)`` clips the result to the source image.
    """
    boxes = np.asarray(boxes, dtype=np.float64)
    d2i = np.asarray(d2i, dtype=np.float64)
    if boxes.shape[-1:] != (4,):
        raise ValueError(f"boxes must have shape [..., 4] (x1, y1, x2, y2), got {boxes.shape}")
    if d2i.shape != (2, 3):
        raise ValueError(f"d2i must be one image's 2x3 matrix, got shape {d2i.shape}; "
                         "for a batch pass d2i[i] with that image's boxes")
    x1, y1, x2, y2 = np.moveaxis(boxes, -1, 0)
    # d2i maps pixel indices (centres); a continuous coordinate u is the index u - 1/2.
    xs = np.stack([x1, x2, x2, x1]) - 0.5
    ys = np.stack([y1, y1, y2, y2]) - 0.5
    sx = d2i[0, 0] * xs + d2i[0, 1] * ys + d2i[0, 2] + 0.5
    sy = d2i[1, 0] * xs + d2i[1, 1] * ys + d2i[1, 2] + 0.5
    out = np.stack([sx.min(0), sy.min(0), sx.max(0), sy.max(0)], axis=-1)
    if shape is not None:
        h, w = shape
        out[..., 0::2] = out[..., 0::2].clip(0, w)
        out[..., 1::2] = out[..., 1::2].clip(0, h)
    return out
