"""The Snavely camera of the BAL dataset, written once with pyclad; nothing is
differentiated by hand.

Camera: 9 parameters ``[w (angle-axis, 3), t (3), f, k1, k2]``. A point X projects as
``P = R(w) X + t``, ``p = -P.xy / P.z``, ``r = 1 + k1 |p|^2 + k2 |p|^4``, and the residual
is ``f r p - observed`` (as Ceres' ``SnavelyReprojectionError``).
"""
from __future__ import annotations

import numpy as np
import pyopencl.array as cla

import pyclad as pc
from clkernels import get_runtime

from . import host_memory, ordering
from .cameras import cached_batch_function


def snavely_residual(camera, point, observed):
    """Reprojection residual (2,) of one observation; a pyclad-traceable function."""
    p = pc.rotate_angle_axis(camera[0:3], point) + camera[3:6]
    xp = -p[0] / p[2]
    yp = -p[1] / p[2]
    r2 = xp * xp + yp * yp
    distortion = 1.0 + r2 * (camera[7] + camera[8] * r2)
    return [camera[6] * distortion * xp - observed[0],
            camera[6] * distortion * yp - observed[1]]


def snavely_function(dtype=np.float64, backend="codegen", device=None) -> pc.BatchFunction:
    """The batched residual of :func:`snavely_residual` (traced once per dtype/backend)."""
    return cached_batch_function("snavely_residual", snavely_residual, (9, 3), 2, dtype, backend, device)


class SnavelyModel:
    """Residuals and Jacobian blocks of every observation of a BAL problem.

    The observation index and the observed points go to the device once; each call sends
    only the current cameras and points. Arrays in and out are float64 numpy arrays; with
    ``dtype=np.float32`` the evaluation itself is in single precision.
    """

    def __init__(self, cam_idx, pt_idx, observations, dtype=np.float64, device=None,
                 backend="codegen"):
        self.dtype = np.dtype(dtype)
        self.function = snavely_function(self.dtype, backend, device)
        self.n_obs = len(observations)
        # Written a chunk at a time: stacking first would make an int64 copy twice this size.
        index = ordering.columns([cam_idx, pt_idx], np.int32)
        observed = np.ascontiguousarray(observations, dtype=self.dtype)
        self._host = (index, observed)
        self._device = None
        self._upload = False
        if backend != "numpy":
            runtime = get_runtime(device)
            self.runtime = runtime
            # Keep index and observations on the device when they fit comfortably; a CPU
            # device instead works on the host arrays in place, and anything too large is
            # evaluated from the host in chunks.
            per_obs = 4 * 2 + self.dtype.itemsize * (2 + 2 + 2 * 12)
            in_place = host_memory.shares_host_memory(runtime)
            # Uploaded at the first call, not here (see device_inputs).
            self._upload = not in_place and per_obs * self.n_obs < runtime.info.global_mem_bytes // 3 and \
                self.dtype.itemsize * 2 * 9 * self.n_obs < runtime.info.max_alloc_bytes

    def _params(self, cameras, points):
        cameras = np.ascontiguousarray(cameras, dtype=self.dtype)
        points = np.ascontiguousarray(points, dtype=self.dtype)
        if self._device is None and self._upload:
            self.device_inputs()
        if self._device is None:
            return [cameras, points], self._host
        q = self.runtime.queue
        return [cla.to_device(q, cameras), cla.to_device(q, points)], self._device

    def device_inputs(self):
        """The observation index (n, 2) int32 and the observations (n, 2) on the device, uploaded
        once (on a CPU device: buffers over the host arrays): what this model's calls with device
        parameters read (the device-resident solver, solvers.lm_device, passes them to
        :attr:`function` itself)."""
        if self._device is None:
            # On a CPU device: buffers over the host arrays (kernels only read them), no copies.
            self._device = tuple(host_memory.read_only(self.runtime, a) for a in self._host)
        return self._device

    @staticmethod
    def _host_f64(a):
        a = a.get() if isinstance(a, cla.Array) else a
        return a.astype(np.float64, copy=False)

    def residuals(self, cameras, points) -> np.ndarray:
        """(n_obs, 2) residuals."""
        params, (index, observed) = self._params(cameras, points)
        return self._host_f64(self.function.values(params, index, data=observed))

    def residuals_and_jacobians(self, cameras, points):
        """(n_obs, 2) residuals, (n_obs, 2, 9) camera and (n_obs, 2, 3) point Jacobians."""
        params, (index, observed) = self._params(cameras, points)
        r, (jc, jp) = self.function.values_and_jacobians(params, index, data=observed)
        return self._host_f64(r), self._host_f64(jc), self._host_f64(jp)
