"""A build worker of :mod:`clkernels.build_pool`: ``python -m clkernels.build_worker IDENTITY``.

It opens the OpenCL device whose :func:`clkernels.cache.device_identity` is ``IDENTITY``, then
answers one JSON line, ``{"ready": true}`` (or ``false`` with the ``error``, and ends), then
reads jobs from stdin, one JSON object a line (``key``, ``source``, ``options``, ``name``), builds
each from source into the binary cache (:func:`clkernels.templates.build`, the same path as the
caller's own build) and answers one JSON line: ``{"key": ..., "error": null}`` or the error's
text. It ends at the end of its input.
"""
from __future__ import annotations

import json
import sys
import warnings


def _device(identity: str):
    import pyopencl as cl
    from .cache import device_identity
    for platform in cl.get_platforms():
        for device in platform.get_devices():
            if device_identity(device) == identity:
                return device
    return None


def main(argv) -> int:
    identity = argv[0]
    warnings.simplefilter("ignore")      # the compiler's notes: the caller's own build shows them
    try:
        from .runtime import get_runtime
        from .templates import build
        device = _device(identity)
        runtime = get_runtime(device) if device is not None else None
        setup_error = None if device is not None else f"no OpenCL device is {identity!r}"
    except Exception as exc:             # the caller then builds every job itself
        runtime, setup_error = None, f"{type(exc).__name__}: {exc}"
    _answer({"ready": setup_error is None, "error": setup_error})
    if setup_error is not None:
        return 0
    for line in sys.stdin:
        job = json.loads(line)
        error = None
        try:
            build(job["source"], runtime, tuple(job["options"]), job["name"])
        except Exception as exc:         # the caller rebuilds in its process and raises its own error
            error = f"{type(exc).__name__}: {str(exc)[:2000]}"
        _answer({"key": job["key"], "error": error})
    return 0


def _answer(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
