"""A camera model of the bundle adjuster from any two-group pyclad ``BatchFunction``:
``fn(camera_row, point_row[, data]) -> residuals`` over observations sorted by point.

This is what :class:`solvers.ba.evaluator.Evaluator` and the device-resident iterations
(:mod:`solvers.ba.lm_device`) evaluate: the Snavely camera of BAL (:class:`solvers.models.snavely.SnavelyModel`)
and any :class:`solvers.Problem` with one residual kind over one camera-like group and the
eliminated group, whatever their block sizes.
"""
from __future__ import annotations

import numpy as np
import pyopencl.array as cla

from clkernels import get_runtime

from ..linalg import inputs_device
from ..ba import ordering


class BatchModel:
    """Residuals (n, R) and Jacobian blocks (n, R, C), (n, R, P) of every observation.

    The observation index and the data go to the device once; each call sends only the current
    cameras and points. Arrays in and out are float64 numpy arrays; the evaluation itself is in
    the function's dtype.
    """

    # solvers.ba.evaluator.Evaluator may give it the observations ordered on the device (inputs=).
    takes_device_inputs = True

    def __init__(self, function, cam_idx, pt_idx, observations=None, device=None, inputs=None):
        """``inputs``: the index (n, 2) int32 and the data (n, D) already on the device
        (solvers.ba.observations_device), instead of the host arrays ``cam_idx``, ``pt_idx`` and
        ``observations`` (then None)."""
        if len(function.group_sizes) != 2:
            raise ValueError(f"a BatchModel needs a function of two parameter groups (camera, point), "
                             f"got {len(function.group_sizes)}")
        self.function = function
        self.dtype = np.dtype(function.dtype)
        self.sizes = tuple(function.group_sizes)
        self.num_residuals = int(function.n_outputs)
        if inputs is not None:
            if function.backend == "numpy":
                raise ValueError("device inputs need a BatchFunction that runs on an OpenCL device, "
                                 "not backend='numpy'")
            index, observed = inputs
            if observed is not None and observed.dtype != self.dtype:
                raise ValueError(f"the device observations are {observed.dtype}, the function's dtype {self.dtype}")
            self.n_obs = int(index.shape[0])
            self.runtime = get_runtime(device)
            self._host, self._device, self._upload = None, (index, observed), False
            return
        self.n_obs = len(cam_idx)
        # Written a chunk at a time: stacking first would make an int64 copy twice this size.
        index = ordering.columns([cam_idx, pt_idx], np.int32)
        observed = None if observations is None else np.ascontiguousarray(observations, dtype=self.dtype)
        self._host = (index, observed)
        self._device = None
        self._upload = False
        if function.backend != "numpy":
            runtime = get_runtime(device)
            self.runtime = runtime
            # Keep index and data on the device when they fit comfortably; a CPU device instead
            # works on the host arrays in place, and anything too large is evaluated from the
            # host in chunks.
            C, P = self.sizes
            R, D = function.n_outputs, (0 if observed is None else observed.shape[1])
            per_obs = 4 * 2 + self.dtype.itemsize * (D + R + R * (C + P))
            in_place = inputs_device.shares_host_memory(runtime)
            # Uploaded at the first call, not here (see device_inputs).
            self._upload = not in_place and per_obs * self.n_obs < runtime.info.global_mem_bytes // 3 and \
                self.dtype.itemsize * R * C * self.n_obs < runtime.info.max_alloc_bytes

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
        """The observation index (n, 2) int32 and the data (n, D) (None without data) on the
        device, uploaded once (on a CPU device: buffers over the host arrays): what this model's
        calls with device parameters read (the device-resident solver, solvers.ba.lm_device, passes
        them to :attr:`function` itself)."""
        if self._device is None:
            # On a CPU device: buffers over the host arrays (kernels only read them), no copies.
            self._device = tuple(None if a is None else inputs_device.read_only(self.runtime, a)
                                 for a in self._host)
        return self._device

    @staticmethod
    def _host_f64(a):
        a = a.get() if isinstance(a, cla.Array) else a
        return a.astype(np.float64, copy=False)

    def residuals(self, cameras, points) -> np.ndarray:
        """(n_obs, R) residuals."""
        params, (index, observed) = self._params(cameras, points)
        return self._host_f64(self.function.values(params, index, data=observed))

    def residuals_and_jacobians(self, cameras, points):
        """(n_obs, R) residuals, (n_obs, R, C) camera and (n_obs, R, P) point Jacobians."""
        params, (index, observed) = self._params(cameras, points)
        r, (jc, jp) = self.function.values_and_jacobians(params, index, data=observed)
        return self._host_f64(r), self._host_f64(jc), self._host_f64(jp)
