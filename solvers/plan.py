"""The planning step of a solve: which core runs it, with which linear solver, on which state.

It runs once per :func:`solvers.solve`, before the minimizer starts. It resolves the device once
(:func:`resolve_device`): the cores, models, evaluators and states get that runtime. It hands the minimizer a
core whose ``make_state`` builds the loop state (the minimizer imports no concrete state). What
it chose, and why, goes into the log and the report (``notes``, ``linear_solver_detail``).

Two cores run the iterations, chosen by the problem's shape:

- **the bundle-adjustment core** (:class:`BACore`: :class:`solvers.ba.evaluator.Evaluator` with
  :mod:`solvers.ba.lm_device` or :mod:`solvers.ba.host_state`): one residual kind over two
  groups, one of them eliminated, nothing constant; or groups that one kind always uses together
  merged into one camera group (:mod:`solvers.general.merged_groups`), constant entries held on
  the device. Every iteration stays on the OpenCL device where it can; the host reference
  (:mod:`solvers.ba.host_state`) runs the rest. Both take any block sizes.
  :func:`solvers.bundle_adjust` is this case. Split over devices or MPI ranks:
  :mod:`solvers.split`.
- **the general core** (:class:`GeneralCore`: :mod:`solvers.general.sparse_state`, scipy on the
  host, the Schur reductions on the device where they pay): any number of residual kinds and
  groups, groups shared by many residuals (intrinsics), constant rows and entries.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .ba.observation_index import ObservationIndex
from .linalg.linear_solver import SCHUR_METHODS, linear_solver as method
from .models.loss import Loss


def choose_linear_solver(problem, linear_solver: str, eliminate):
    """``(eliminated group or None, linear solver, notes)``: the group the Schur complement
    eliminates (``eliminate``: a name, ``"auto"`` or None), and the registry's replacement for a
    Schur method when nothing can be eliminated (its ``without_elimination``; a note says so)."""
    notes = []
    eliminated = None
    entry = method(linear_solver)
    if entry.eliminates:
        eliminated = problem.choose_eliminated(eliminate)
        if eliminated is None:
            notes.append(f"No group can be eliminated (eliminate={eliminate!r}): "
                         f"{linear_solver} falls back to {entry.without_elimination}")
            linear_solver = entry.without_elimination
    return eliminated, linear_solver, notes


def resolve_device(problem, opts):
    """The solve's OpenCL device as a ``clkernels.Runtime``, resolved once here (the problem's
    ``device``: a name, a device, a runtime, or None for ``PYCLAD_DEVICE`` / the first device); the
    cores, evaluators, models and states get this runtime, not the name. A name that matches no
    device is an error at once (``DeviceNotFoundError`` with the list), whatever the backends.
    None where nothing needs OpenCL (numpy evaluation and Schur products, no device named) or
    where there is no OpenCL platform and nothing asks for one."""
    if problem.device is None and problem.backend == "numpy" and opts.schur_backend == "numpy":
        return None
    from clkernels import NoPlatformError, get_runtime
    try:
        return get_runtime(problem.device)
    except NoPlatformError:
        if problem.device is not None or opts.schur_backend == "opencl" or problem.backend not in ("auto", "numpy"):
            raise
        return None         # numpy evaluation and the numpy Schur complement still work


def choose_core(problem, eliminated: Optional[str], opts, model=None, resuming: bool = False, runtime=None):
    """The core that runs the solve (the module docstring): the bundle-adjustment core where the
    problem has its shape and it can run, else the general core. ``model``: a camera model in
    place of pyclad (the bundle-adjustment core only); ``resuming``: from a checkpoint (a merge of
    groups does not resume); ``runtime``: :func:`resolve_device`'s answer (None: resolved here).
    ValueError where the options ask what no core can give."""
    if runtime is None:
        runtime = resolve_device(problem, opts)
    linear_solver = opts.linear_solver
    shape = core_shape(problem, eliminated) if linear_solver in SCHUR_METHODS else None
    core = None
    if shape is not None:
        core = BACore(problem, shape, opts, model, runtime=runtime)
        if not core.runs(opts):
            core = None
    elif (linear_solver in SCHUR_METHODS and model is None and not resuming and opts.checkpoint is None
          and opts.device_resident is not False and opts.schur_backend != "numpy"):
        # Groups always used together (a pose and its image's own camera) as one camera group,
        # constant entries held on the device: the bundle-adjustment core, where it runs there.
        from .general.merged_groups import merge_groups
        # (Shared columns need the reduced matrix factorised: a CG solve has no copies' sums.)
        merged = merge_groups(problem, eliminated, shared=not method(linear_solver).iterative)
        if merged is not None:
            core = BACore(merged.problem, core_shape(merged.problem, eliminated, constants=True),
                          opts, None, merged=merged, original=problem, runtime=runtime)
            # (A split keeps the merge: its parts' states are device-resident or it is refused.)
            if not (opts.split or core.runs(opts)):
                core = None
    if core is None:
        if model is not None:
            raise ValueError("model= is for a problem of one residual kind over a camera group and an "
                             "eliminated group with nothing constant; this problem is evaluated with pyclad")
        core = GeneralCore(problem, eliminated, opts, runtime)
    if opts.split and not isinstance(core, BACore):
        raise ValueError("devices= / comm= split a bundle-adjustment problem (one residual kind over a camera "
                         "group and an eliminated point group, or a COLMAP reconstruction with a camera per "
                         "image and linear_solver='iterative_schur'); this problem runs on one device")
    return core


def one_device_state(evaluator, options, runtime, x0):
    """The bundle-adjustment core's loop state on one device: every iteration on the device
    (:class:`solvers.ba.lm_device.DeviceState`) when the options, the model and the device allow
    it, else the host reference (:class:`solvers.ba.host_state.HostState`, its products on the
    device where it has fp64)."""
    from .ba.lm_device import device_state_or_reason
    state, why = device_state_or_reason(evaluator, options, runtime, x0)
    if state is not None:
        return state
    if options.device_resident is True:
        raise ValueError(f"device_resident=True, but {why}")
    # The host reference (and scipy under it) is imported only for a solve that runs it.
    from .ba.host_state import HostState
    if options.schur_backend != "numpy" and runtime is not None and runtime.info.fp64:
        return HostState(evaluator, options, x0, runtime=runtime)
    if options.schur_backend == "opencl":
        raise ValueError("schur_backend='opencl' needs an OpenCL device with fp64; "
                         "pass device= one that has it, or schur_backend='numpy'")
    return HostState(evaluator, options, x0)


def _loss_name(loss: Loss) -> str:
    return "TRIVIAL" if loss.name == "trivial" else f"{loss.name.upper()}({loss.scale:g})"


_swapped = {}


def _camera_first(fn):
    """``fn`` with its two groups' order swapped, one wrapper per function (so that its kernel is
    cached like ``fn``'s)."""
    if fn not in _swapped:
        def swapped(point, camera, *data):
            return fn(camera, point, *data)
        swapped.__name__ = swapped.__qualname__ = f"{getattr(fn, '__qualname__', 'residual')}_camera_first"
        swapped.__module__ = getattr(fn, "__module__", None)
        _swapped[fn] = swapped
    return _swapped[fn]


def core_shape(problem, eliminated: Optional[str], constants: bool = False):
    """``(camera group, point group, residual kind, swapped)`` when the problem has the
    bundle-adjustment core's shape (the module docstring), else None; ``constants``: the two groups
    may have constant entries (held on the device: solvers.general.merged_groups)."""
    if eliminated is None or len(problem.residuals) != 1:
        return None
    block = problem.residuals[0]
    if len(block.groups) != 2 or block.groups[0] is block.groups[1]:
        return None
    if not constants and any(g.has_constants for g in block.groups):
        return None
    if any(g is not block.groups[0] and g is not block.groups[1] and not g.is_constant
           for g in problem.groups.values()):
        return None
    names = [g.name for g in block.groups]
    if eliminated not in names:
        return None
    swapped = names[0] == eliminated
    cam, pt = (block.groups[1], block.groups[0]) if swapped else (block.groups[0], block.groups[1])
    return cam, pt, block, swapped


def _counts(problem, layout_rows, layout_params, tangent, eliminated, schur):
    blocks = sum(g.num_rows for g in problem.groups.values())
    params = sum(g.values.size for g in problem.groups.values())
    R = sum(r.num_blocks * r.num_residuals for r in problem.residuals)
    e_rows = problem.groups[eliminated].num_rows if eliminated else 0
    return dict(num_parameter_blocks=blocks, num_parameters=params, num_parameter_blocks_reduced=layout_rows,
                num_parameters_reduced=layout_params, num_effective_parameters=tangent,
                num_residual_blocks=problem.num_residual_blocks, num_residuals=R, schur_structure=schur,
                ordering=(f"{e_rows},{layout_rows - e_rows}" if eliminated else f"{layout_rows}"))


class BACore:
    """The bundle-adjustment core (:mod:`solvers.plan`'s docstring)."""
    name = "bundle-adjustment"

    def __init__(self, problem, shape, opts, model, merged=None, original=None, runtime=None):
        """``runtime``: the solve's device (:func:`resolve_device`; None: resolved here)."""
        self.problem, self.opts = problem, opts
        if runtime is None:
            runtime = resolve_device(problem, opts)
        # What the functions, models and evaluators get: the runtime, or (no OpenCL) the problem's None.
        device = runtime if runtime is not None else problem.device
        # A merge (solvers.general.merged_groups) of ``original``'s groups, whose constant entries the
        # device holds: reports and results are of the original problem.
        self.merged, self.original = merged, original
        cam, pt, block, swapped = shape
        self.cam, self.pt, self.block = cam, pt, block
        ci, pi = (block.columns[1], block.columns[0]) if swapped else (block.columns[0], block.columns[1])
        self.checkpoint_problem = ObservationIndex(ci, pi, block.data, cam.num_rows, pt.num_rows, problem.name,
                                                cam.size, pt.size)
        self.loss_name = _loss_name(block.loss)
        if model is None:
            from .models.batch_model import BatchModel
            from .general.problem_evaluator import batch_function
            f = batch_function(_camera_first(block.fn) if swapped else block.fn, (cam.size, pt.size),
                               0 if block.data is None else block.data.shape[1], problem.dtype,
                               problem.backend, device)

            def model(c, p, obs, dtype=None, device=None, backend=None, inputs=None):
                return BatchModel(f, c, p, obs, device=device, inputs=inputs)
            model.takes_device_inputs = f.backend != "numpy"
        self._model, self._loss = model, block.loss
        self.evaluator = self._evaluator(self.checkpoint_problem, device)
        self.model_name = type(self.evaluator.model).__name__
        if merged is not None:          # the report names the problem's residual kind
            self.model_name = ", ".join(r.name for r in original.residuals)
        # Residuals per block: the model function's (a model= of another kind: BAL's 2).
        self.num_residuals = block.num_residuals = self.evaluator.R
        # The Schur complement's products run on the solve's device unless told to stay on the host.
        self.runtime = runtime if opts.schur_backend != "numpy" else None
        evaluates_on = getattr(self.evaluator.model, "runtime", None)    # (a model= may have none)
        self.device_name = evaluates_on.info.name if evaluates_on is not None else "host"

    def runs(self, opts) -> bool:
        """Whether this core can run the solve: on the device, or by its host reference (any block
        sizes), which holds nothing constant, so a merge needs the device."""
        from .ba.lm_device import device_unavailable_reason
        why = device_unavailable_reason(self.evaluator, opts, self.runtime)
        if self.merged is not None:
            return why is None and self._merge_fits()
        return True

    def _merge_fits(self) -> bool:
        """Whether the device-resident core serves a merge (solvers.general.merged_groups) faster than
        the general core would. On GPUs: wherever the keys' matrix of shared columns fits one
        buffer and their reduced matrix the dense device Cholesky (solvers.linalg.sparse_schur_device).
        On CPUs, where S is factorised on the host: up to 1,000 unknowns (LAPACK, cheap whatever
        the sparsity); above, a nearly full S (the general core's criterion for its dense
        reductions) only with shared columns, whose problem columns LAPACK factorises, and a
        sparse S only without (CHOLMOD from the blocks, as for BAL). A nearly full S of merged
        rows with constant entries is the general core's: it factorises over the free columns
        alone (300 images with a camera each: 1.4 s against 1.9 s)."""
        from .linalg import factorisation_limits as limits
        info, m, ev = self.runtime.info, self.merged, self.evaluator
        nv = m.free.size
        if m.copies is not None and 8 * nv * nv > info.max_alloc_bytes:
            return False
        if not info.is_cpu:
            return m.copies is None or m.num_columns <= limits.DEVICE_DENSE_MAX
        n = m.num_columns if m.copies is not None else nv
        if n <= limits.HOST_DENSE_MAX:
            return True
        if n > limits.DENSE_FILL_MAX:
            return m.copies is None
        from .linalg.schur_reduced_device import MAX_RUN_CPU, ReducedPattern
        # The pattern of the keys' blocks, kept for the solve's own (solvers.linalg.sparse_schur_device).
        pat = ReducedPattern(ev.cam, ev.pt, ev.nc, ev.npt, max_run=MAX_RUN_CPU, camera_order=ev.camera_order())
        ev.reduced_pattern = pat
        return (pat.fill >= limits.DENSE_FILL) == (m.copies is not None)

    def _evaluator(self, observations, device, camera_order=None):
        """The evaluator of ``observations`` (the problem's, or a part's) on ``device``
        (``camera_order``: solvers.ba.evaluator.Evaluator's), with the observations ordered on the
        device where that pays (solvers.ba.observations_device)."""
        from .ba.evaluator import Evaluator
        p = self.problem
        return Evaluator(observations, self._loss, model=self._model, dtype=p.dtype, device=device,
                         backend=None if p.backend == "auto" else p.backend, camera_order=camera_order,
                         device_observations=self._device_observations(observations, device, camera_order))

    def _device_observations(self, observations, device, camera_order):
        """The observations ordered on the device, or None: only for the device-resident path of
        one device (not a split's parts, whose orders come from the whole problem's), with a
        model that takes device inputs."""
        o, p = self.opts, self.problem
        if (o.device_setup is False or o.split or camera_order is not None or o.device_resident is False
                or o.schur_backend == "numpy" or p.backend == "numpy" or device is None
                or not _takes_device_inputs(self._model)):
            return None
        from clkernels import get_runtime
        from .ba import observations_device as dobs
        rt = get_runtime(device)        # (the solve's runtime: resolved already)
        if not dobs.wanted(rt, observations.num_observations, o.device_setup):
            return None
        return dobs.DeviceObservations(rt, observations.camera_index, observations.point_index,
                                       observations.observations, observations.num_cameras,
                                       observations.num_points, p.dtype)

    def partitioned(self):
        """solvers.loop.lm.Minimizer's state factory for a solve split over devices or MPI ranks."""
        from .split.partitioned import partitioned_state
        m = self.merged
        if m is not None and m.copies is not None:
            raise ValueError("devices= / comm= split a problem whose cameras each serve one image; here images "
                             "share a camera (its columns are copies), which only one device solves")
        held = None if m is None else (m.free, m.free_points, m.excluded_sq)

        def make(ev, options, runtime, x0):
            return partitioned_state(ev, options, x0, self.checkpoint_problem, self._evaluator,
                                     host_path=m is None,
                                     camera_blocks=None if m is None else m.block_sizes, held=held)
        return make

    @property
    def make_state(self):
        """The loop state's factory for :func:`solvers.loop.lm.minimize`: :func:`one_device_state`
        (the device, else the host reference), or, for a merge, the device with the constant
        entries held; split over devices or ranks when the options say so."""
        if self.opts.split:
            return self.partitioned()
        if self.merged is None:
            return one_device_state
        merged = self.merged

        def make(evaluator, options, runtime, x0):
            from .ba.lm_device import DeviceState
            state = DeviceState(evaluator, options, runtime, x0, profile=options.profile_kernels,
                                camera_blocks=merged.block_sizes, copies=merged.copies)
            state.hold_constant(merged.free, merged.free_points, merged.excluded_sq)
            return state
        return make

    def x0(self):
        return np.concatenate([self.cam.values.ravel(), self.pt.values.ravel()])

    def x_from_checkpoint(self, ck):
        return ck.x

    def parameters(self, x) -> dict:
        cams, pts = self.evaluator.split(x)
        solved = {self.cam.name: cams.copy(), self.pt.name: pts.copy()}
        if self.merged is not None:
            return self.merged.parameters(solved)
        # The other groups are constant here: copies of them as given.
        return {k: solved[k] if k in solved else g.values.copy() for k, g in self.problem.groups.items()}

    def counts(self, problem) -> dict:
        if self.merged is not None:          # the original problem's, as the general core counts them
            from .general.problem_evaluator import Layout
            if len(self.original.residuals) == 1:     # (a union's kinds were counted by the merge)
                self.original.residuals[0].num_residuals = self.num_residuals
            return _layout_counts(self.original, Layout(self.original, self.pt.name))
        C, P = self.evaluator.C, self.evaluator.P
        rows = self.cam.num_rows + self.pt.num_rows
        params = C * self.cam.num_rows + P * self.pt.num_rows
        return _counts(problem, rows, params, params, self.pt.name, f"{self.num_residuals},{P},{C}")


def _takes_device_inputs(model) -> bool:
    """Whether a camera model (class or factory) takes the observations ordered on the device
    (``inputs=``, solvers.models.batch_model.BatchModel); a subclass whose constructor has no such
    argument does not."""
    if not getattr(model, "takes_device_inputs", False):
        return False
    import inspect
    try:
        return "inputs" in inspect.signature(model).parameters
    except (TypeError, ValueError):
        return False


class GeneralCore:
    """The general core (:mod:`solvers.plan`'s docstring)."""
    name = "general"
    runtime = None

    def __init__(self, problem, eliminated, opts, runtime=None):
        """``runtime``: the solve's device (:func:`resolve_device`; None: resolved here)."""
        from .general.problem_evaluator import Layout, ProblemEvaluator
        if runtime is None:
            runtime = resolve_device(problem, opts)
        self.problem = problem
        self.layout = Layout(problem, eliminated)
        self.evaluator = ProblemEvaluator(problem, self.layout, runtime if runtime is not None else problem.device)
        self.loss_name = ", ".join(sorted({_loss_name(r.loss) for r in problem.residuals}))
        self.model_name = ", ".join(r.name for r in problem.residuals)
        if all(f.backend == "numpy" for f in self.evaluator.functions):
            self.device_name = "host"
        else:
            rt = runtime
            self.device_name = rt.info.name
            # The Schur reduction of dense reduced matrices runs there (solvers.general.pair_schur_device).
            if opts.schur_backend != "numpy":
                self.runtime = rt

    def make_state(self, evaluator, options, runtime, x0):
        from .general.sparse_state import SparseState
        if options.device_resident is True:
            raise ValueError("device_resident=True, but this problem runs the general core on the host "
                             "(several groups per residual, several residual kinds or constant parameters)")
        return SparseState(evaluator, options, x0, runtime=runtime)

    @property
    def checkpoint_problem(self):
        return self.problem

    def x0(self):
        return self.layout.x0(self.problem)

    def x_from_checkpoint(self, ck):
        return ck.x(self.layout, self.problem)

    def parameters(self, x) -> dict:
        return {name: self.layout.values(self.problem, x, name).copy() for name in self.problem.groups}

    def counts(self, problem) -> dict:
        return _layout_counts(problem, self.layout)


def _layout_counts(problem, lay) -> dict:
    """The report's counts of a general problem with its :class:`solvers.general.problem_evaluator.Layout`."""
    rows = sum(g.rows.size for g in lay.groups)
    R = {r.num_residuals for r in problem.residuals}
    e = lay.by_name.get(lay.eliminated) if lay.eliminated else None
    f_sizes = {g.free.size for g in lay.groups if g is not e and g.rows.size}
    schur = (f"{R.pop() if len(R) == 1 else 'd'},{e.free.size},"
             f"{f_sizes.pop() if len(f_sizes) == 1 else 'd'}") if e is not None else ""
    return _counts(problem, rows, lay.x_size, lay.t_size, lay.eliminated, schur)
