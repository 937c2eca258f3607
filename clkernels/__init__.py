"""clkernels: the OpenCL layer of pyclad.

Device selection and the per-device context/queue (:mod:`clkernels.runtime`), Mako
rendering with a build cache (:mod:`clkernels.templates`), and the vision kernels, each a
``name.py`` launcher beside its ``name.cl.mako`` template. ``python -m clkernels`` lists
the OpenCL devices and marks the one that would be chosen.
"""
from .runtime import (DeviceInfo, DeviceNotFoundError, NoPlatformError, Runtime,
                      describe_devices, get_runtime, list_devices, match_devices,
                      select_device, unusable_devices, use_device)
from .templates import BuildError, FP64Error, build, get_program, render
from .memory import DeviceMemoryError

# The kernels' launchers. Imported here (they build nothing until first called) so that
# clkernels.dcnv4 is the function, not the submodule of the same name that holds it.
from .dcnv4 import dcnv4, dcnv4_backward  # noqa: E402
from .deformable_aggregation import (deformable_aggregation,  # noqa: E402
                                     deformable_aggregation_backward, feature_maps_format)
from .warp_affine import letterbox, scale_boxes, warp_affine  # noqa: E402
from . import autotune  # noqa: E402  (launch shapes chosen by measuring; dcnv4 imports it anyway)

_KERNELS = ["deformable_aggregation", "deformable_aggregation_backward", "feature_maps_format",
            "dcnv4", "dcnv4_backward", "letterbox", "warp_affine", "scale_boxes"]

__all__ = ["DeviceInfo", "DeviceMemoryError", "DeviceNotFoundError", "NoPlatformError", "Runtime", "BuildError",
           "FP64Error", "describe_devices", "get_runtime", "list_devices", "match_devices",
           "select_device", "unusable_devices", "use_device", "build", "get_program", "render", "autotune",
           *_KERNELS]
