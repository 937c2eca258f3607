"""clkernels: the OpenCL layer of pyclad.

Device selection and the per-device context/queue (:mod:`clkernels.runtime`), Mako
rendering with a build cache (:mod:`clkernels.templates`), and the vision kernels, each a
``name.py`` launcher beside its ``name.cl.mako`` template. ``python -m clkernels`` lists
the OpenCL devices and marks the one that would be chosen.
"""
import importlib

from .runtime import (DeviceInfo, DeviceNotFoundError, NoPlatformError, Runtime,
                      describe_devices, get_runtime, list_devices, match_devices,
                      select_device, use_device)
from .templates import BuildError, FP64Error, build, get_program, render

# Kernels are imported on first use, so that importing clkernels stays cheap and one
# kernel's module never costs the others. Name -> module that defines it.
_KERNELS = {
    "deformable_aggregation": "deformable_aggregation",
    "deformable_aggregation_backward": "deformable_aggregation",
    "feature_maps_format": "deformable_aggregation",
    "dcnv4": "dcnv4",
    "dcnv4_backward": "dcnv4",
    "letterbox": "warp_affine",
    "warp_affine": "warp_affine",
    "scale_boxes": "warp_affine",
}


def __getattr__(name):
    if name in _KERNELS:
        module_name = _KERNELS[name]
        module = importlib.import_module(f".{module_name}", __name__)
        # Importing a submodule binds its name here (clkernels.dcnv4 would become the module);
        # bind every function it provides instead, so the names keep meaning the functions.
        for exported, source in _KERNELS.items():
            if source == module_name:
                globals()[exported] = getattr(module, exported)
        return globals()[name]
    raise AttributeError(f"module 'clkernels' has no attribute {name!r}")


__all__ = ["DeviceInfo", "DeviceNotFoundError", "NoPlatformError", "Runtime", "BuildError",
           "FP64Error", "describe_devices", "get_runtime", "list_devices", "match_devices",
           "select_device", "use_device", "build", "get_program", "render", *_KERNELS]
