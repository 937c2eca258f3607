"""Cost, residuals and Jacobians of a BAL problem through a camera model and a robust loss.

The model sees the observations sorted by point (what the Schur solvers need); the state vector
``x`` is the cameras (C per camera: 9 in BAL) then the points (P per point: 3), as in a BAL file.
``problem`` is a :class:`solvers.BALProblem` or anything with its index fields (``camera_index``,
``point_index``, ``observations``, ``num_cameras``, ``num_points``, ``num_observations``).
"""
from __future__ import annotations

import time
from typing import Optional

import numpy as np

from . import ordering
from ..models.loss import Loss, correct


def default_model_class():
    """``solvers.models.snavely.SnavelyModel`` (pyclad); a clear ImportError when it cannot be loaded."""
    try:
        from ..models.snavely import SnavelyModel
    except ImportError as e:  # pyclad or pyopencl missing
        raise ImportError(f"the default camera model (solvers.models.snavely.SnavelyModel, built on pyclad) "
                          f"cannot be imported: {e}. Install pyclad's requirements or pass model=") from e
    return SnavelyModel


class Evaluator:
    """Evaluates the problem at a state vector; counts and times the evaluations."""

    layout = None           # (the general core's evaluator has one: its checkpoints' tables)
    # The reduced matrix's block pattern where the plan made it already (solvers.plan's merge
    # check), for the device's sparse_schur to take instead of making it again.
    reduced_pattern = None

    def __init__(self, problem, loss: Loss, model=None, dtype=np.float64, device=None, backend=None,
                 camera_order=None, device_observations=None):
        """``camera_order``: :meth:`camera_order`'s answer when the caller knows it already (a part
        of a split solve takes its range's from the whole problem's, solvers.split.partitioned).
        ``device_observations``: the orders made on the device
        (:class:`solvers.ba.observations_device.DeviceObservations`), for a model class that takes
        them (``takes_device_inputs``): the host orders are then read back only if something asks
        for them."""
        self.problem, self.loss = problem, loss
        self.nc, self.npt = problem.num_cameras, problem.num_points
        self.n = problem.num_observations
        self._camera_order = camera_order
        self.device_observations = device_observations
        self._orders = None
        if model is None:
            model = default_model_class()
        self.permute = None
        if isinstance(model, type) or (callable(model) and not hasattr(model, "residuals_and_jacobians")):
            kwargs = {"dtype": dtype, "device": device}
            if backend is not None:
                kwargs["backend"] = backend
            dev = device_observations
            if dev is not None and getattr(model, "takes_device_inputs", False):
                self.model = model(None, None, None, inputs=(dev.index, dev.observed), **kwargs)
            else:
                self.device_observations = None
                _, _, cam, pt, observed = self._host_orders()
                self.model = model(cam, pt, observed, **kwargs)
                # The model keeps its own copy of the observations (observed_in_order gathers anew).
                self._orders = self._orders[:4] + (None,)
        else:
            # An instance built on the problem's own observation order: reorder its outputs.
            if getattr(model, "n_obs", problem.num_observations) != problem.num_observations:
                raise ValueError("model= was built for a different number of observations than the problem")
            self.device_observations = None
            self.model = model
            self.permute = self.order
        # Parameters per camera and per point, residuals per observation: the model's (9, 3 and 2
        # for BAL's; a model= instance that does not say is taken as BAL's).
        self.C, self.P = getattr(self.model, "sizes", (9, 3))
        self.R = getattr(self.model, "num_residuals", 2)
        self.num_residual_evaluations = 0
        self.num_jacobian_evaluations = 0
        self.residual_time = 0.0
        self.jacobian_time = 0.0

    def _host_orders(self):
        """``(in_point_order, order, cam, pt, observed)`` on the host, made at the first use: the
        point order, ``np.argsort(point_index, kind="stable")``, found without a comparison sort
        (solvers.ba.ordering), and the indices in it as int32 (where they fit), which every consumer
        takes; or read back from the device when it made them."""
        if self._orders is None:
            problem, dev = self.problem, self.device_observations
            n = self.n
            cam_type, pt_type = ordering.index_dtype(self.nc), ordering.index_dtype(self.npt)
            if dev is not None:
                self._orders = (False, dev.host("order"), dev.host("cam"), dev.host("pt"), None)
            elif ordering.is_sorted(problem.point_index):
                # Already in point order: nothing to sort or gather.
                self._orders = (True, np.arange(n, dtype=ordering.index_dtype(n)),
                                problem.camera_index.astype(cam_type, copy=False),
                                problem.point_index.astype(pt_type, copy=False), problem.observations)
            else:
                order = ordering.stable_order(problem.point_index, self.npt)
                observed = None if problem.observations is None else ordering.take(problem.observations, order)
                self._orders = (False, order, ordering.take(problem.camera_index, order, dtype=cam_type),
                                ordering.take(problem.point_index, order, dtype=pt_type), observed)
        return self._orders

    @property
    def in_point_order(self) -> bool:
        return self._host_orders()[0]

    @property
    def order(self) -> np.ndarray:
        return self._host_orders()[1]

    @property
    def cam(self) -> np.ndarray:
        return self._host_orders()[2]

    @property
    def pt(self) -> np.ndarray:
        return self._host_orders()[3]

    def camera_order(self) -> np.ndarray:
        """The observations, in this evaluator's (point) order, sorted by camera: the same as
        ``np.argsort(self.cam, kind="stable")`` (int32), made once.

        Problems whose observations come sorted by camera, then point (as BAL files and
        :func:`solvers.synthetic_problem` have them) need no sort: the camera order is then the
        file order, whose positions in point order are the inverse of :attr:`order`."""
        if self._camera_order is None:
            p = self.problem
            if self.device_observations is not None:
                self._camera_order = self.device_observations.host("camera_order")
            elif ordering.is_sorted_by(p.camera_index, p.point_index):
                self._camera_order = ordering.inverse_permutation(self.order)
            else:
                self._camera_order = ordering.stable_order(self.cam, self.nc)
        return self._camera_order

    def observed_in_order(self) -> Optional[np.ndarray]:
        """The problem's observations in this evaluator's (point) order (None without any): the
        problem's own array when it came in that order, else a gather (the model keeps its own
        copy, so this one is not kept)."""
        o = self.problem.observations
        if o is None or self.in_point_order:
            return o
        return ordering.take(o, self.order)

    def split(self, x):
        C, P = self.C, self.P
        return x[:C * self.nc].reshape(self.nc, C), x[C * self.nc:].reshape(self.npt, P)

    def cost(self, x) -> Optional[float]:
        """Cost at ``x``; None when a residual is not finite (Ceres: the evaluation failed)."""
        t0 = time.perf_counter()
        try:
            r = self.model.residuals(*self.split(x))
            if self.permute is not None:
                r = r[self.permute]
            r = np.asarray(r, dtype=np.float64)
            if not np.all(np.isfinite(r)):
                return None
            s = np.einsum("ij,ij->i", r, r)
            c = self.loss.cost(s)
            return c if np.isfinite(c) else None
        finally:
            self.num_residual_evaluations += 1
            self.residual_time += time.perf_counter() - t0

    def evaluate(self, x):
        """``(cost, r, Jc, Jp)`` with Ceres' loss correction applied, observations in point order;
        None when anything is not finite."""
        t0 = time.perf_counter()
        try:
            r, jc, jp = self.model.residuals_and_jacobians(*self.split(x))
            if self.permute is not None:
                r, jc, jp = r[self.permute], jc[self.permute], jp[self.permute]
            r = np.asarray(r, dtype=np.float64)
            jc = np.asarray(jc, dtype=np.float64)
            jp = np.asarray(jp, dtype=np.float64)
            if not (np.all(np.isfinite(r)) and np.all(np.isfinite(jc)) and np.all(np.isfinite(jp))):
                return None
            cost, r, (jc, jp) = correct(self.loss, r, [jc, jp])
            if not np.isfinite(cost):
                return None
            return cost, r, jc, jp
        finally:
            self.num_jacobian_evaluations += 1
            self.jacobian_time += time.perf_counter() - t0
