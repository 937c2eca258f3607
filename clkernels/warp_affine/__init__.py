"""Fused warp-affine preprocessing: letterbox + BGR->RGB + normalise + HWC->CHW in one kernel.

``letterbox(images, size=(640, 640), ...)`` turns uint8 BGR images (one, a list that may mix
sizes, a ``[N, H, W, 3]`` batch, or device arrays) into the planar float blob a detector
eats, plus the destination-to-source matrices ``d2i`` that ``scale_boxes`` uses to map boxes
back. ``warp_affine(image, M, dsize)`` is OpenCV's ``warpAffine`` alone (uint8 HWC out).

Sampling is OpenCV's INTER_LINEAR with BORDER_CONSTANT, computed the way OpenCV >= 4.11
computes it for 8-bit images (float coordinates, one fma per lerp, round half to even), so
results equal OpenCV's on all but a few values per million and never differ by more than one
level. The kernel is ``warp_affine.cl.mako`` in this folder. The modules, each depending only
on those before it:

- :mod:`.geometry`: the letterbox matrix, affine inverses, ``scale_boxes``;
- :mod:`.images`: checking, batching and packing the source images;
- :mod:`.options`: a call's options, checked once per distinct set of values;
- :mod:`.plan`: a call signature's plan (chunks, kernels, fixed arguments) and the per-device
  choices it is keyed by;
- :mod:`.ops`: the calls themselves.
"""
from .geometry import letterbox_matrix, scale_boxes
from .ops import letterbox, warp_affine

__all__ = ["letterbox", "warp_affine", "scale_boxes", "letterbox_matrix"]
