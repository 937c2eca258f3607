"""The LM step's linear solvers: one entry per method (``Options.linear_solver``), each with its
host reference and its device-resident solver, and :func:`linear_solver` that picks one by name.

Both sides solve the Schur-reduced system for the cameras' step; the points' step follows by
back-substitution, done by the caller (:class:`solvers.ba.schur.NormalEquations` on the host,
:class:`solvers.ba.lm_device.DeviceState` on the device). A device solver has this interface:

- ``description``: how it solves, for the log ("" when there is nothing to say);
- ``solve()`` -> ``(ok, iterations, message)``, the cameras' solution left in the state's
  ``pcg.x`` on the device;
- ``nbytes``: the device memory it holds; ``bytes_to_device``, ``bytes_to_host``: what it moved
  apart from the state's own counters.

A new method is one more :class:`LinearSolver` in ``_SOLVERS``. The cores, the split states and
the report ask an entry for its properties (``eliminates``, ``iterative``, ``preconditioner``, ``dense``,
``dtypes``, ``without_elimination``: what replaces it when no group can be eliminated), never for
its name. ``sparse_normal_cholesky`` has neither implementation: it
eliminates nothing, and only the general core (:mod:`solvers.general.sparse_state`) runs it.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import numpy as np
import pyopencl as cl


@dataclasses.dataclass(frozen=True)
class LinearSolver:
    """One method: ``host.solve(neq, entry, Vinv, Dc2, eta, max_iterations, r_tolerance)`` ->
    ``(yc, ok, iterations, message)`` on :class:`solvers.ba.schur.NormalEquations`;
    ``device(state, entry)`` -> a device solver for a :class:`solvers.ba.lm_device.DeviceState` (see
    the module docstring). ``entry`` is this record: an implementation reads its properties, so
    one implementation serves every entry of its kind."""
    name: str
    host: Optional[type]
    device: Optional[Callable]
    dtypes: tuple = (np.float32, np.float64)    # storage types its device solver takes
    eliminates: bool = True     # solves the Schur complement's reduced system (a group eliminated)
    iterative: bool = False     # by CG, the reduced matrix never factorised (else assembled, factorised)
    preconditioner: str = ""    # Ceres' name of the CG's preconditioner, for the report
    dense: bool = False         # factorised dense whatever its size and fill (solvers.linalg.factorisation_limits)
    # What solves the step when no group can be eliminated (Ceres' LinearSolverForZeroEBlocks).
    without_elimination: str = "sparse_normal_cholesky"


class HostExplicitSchur:
    """The reduced camera matrix assembled and factorised on the host (dense LAPACK or a sparse
    factorisation, as solvers.linalg.factorisation_limits.host_dense says for the entry)."""

    @staticmethod
    def solve(neq, entry, Vinv, Dc2, eta, max_iterations, r_tolerance):
        return neq.solve_explicit(Vinv, Dc2, dense=entry.dense)


class HostIterativeSchur:
    """iterative_schur on the host: the implicit Schur complement by CG with the Schur-Jacobi
    preconditioner (on the device's products where the state has fp64, solvers.ba.schur_device)."""

    @staticmethod
    def solve(neq, entry, Vinv, Dc2, eta, max_iterations, r_tolerance):
        return neq.solve_pcg(Vinv, Dc2, eta, max_iterations, r_tolerance)


class DeviceIterativeSchur:
    """iterative_schur on the device: the Schur-Jacobi preconditioner (a pseudo-inverse of every
    block where one is not positive definite, as the host path does), then the PCG of
    :class:`solvers.linalg.schur_pcg_device.DevicePCG`."""

    description = ""
    nbytes = bytes_to_device = bytes_to_host = 0     # counted in the state's and the CG's

    def __init__(self, state, entry):
        self.st = state

    @staticmethod
    def program_requests(runtime, C, P, R, nc, other_bytes, entry, device_setup=False, mixed=None):
        """The programs it builds beyond the state's and the CG's: none."""
        return []

    def close(self):
        """Nothing of its own: its kernels are the state's and the CG's."""

    def solve(self):
        pcg, o = self.st.pcg, self.st.o
        self.preconditioner(pcg.jacobi_blocks(), pcg.cam_seg)
        _, ok, its, msg = pcg.run(q_tolerance=o.eta, r_tolerance=-1.0,
                                  max_iterations=o.max_linear_solver_iterations, read_x=False)
        return ok, its, msg

    def preconditioner(self, blocks, runs):
        """The Schur-Jacobi blocks' inverses into the CG's ``Pinv``, from B + Dc^2 less ``blocks``
        (the sums of G V^-1 G^T per run of one camera's observations, ``runs`` each camera's
        first run; a split solve gives the parts' sums, one run per camera)."""
        st, pcg, nc = self.st, self.st.pcg, self.st.nc
        st.launch("schur_jacobi", nc, st.B.data, pcg.dc2.data, blocks.data, runs.data,
                pcg.Pinv.data, st.failed.data, np.int32(nc))
        if nc:
            failed = np.empty(nc, np.int32)
            cl.enqueue_copy(st.rt.queue, failed, st.failed.data)
            st.bytes_to_host += failed.nbytes
            if failed.any():
                self._pseudo_inverse_preconditioner(failed)

    def _pseudo_inverse_preconditioner(self, failed):
        """A diagonal block of S that is not positive definite (``failed``, per camera): as the host
        path, every block's inverse becomes a pseudo-inverse (rare: the failed blocks came back as
        they are, see schur_jacobi)."""
        st = self.st
        C, pcg = st.C, st.pcg
        blocks = np.empty((st.nc, C, C), st.dtype)
        cl.enqueue_copy(st.rt.queue, blocks, pcg.Pinv.data)
        blocks = blocks.astype(np.float64)
        # The blocks that did factorise came back inverted: invert them back to S's blocks.
        ok = failed == 0
        with np.errstate(all="ignore"):
            blocks[ok] = np.linalg.inv(blocks[ok])
            pinv = np.linalg.pinv(blocks, hermitian=True)
        st.bytes_to_host += blocks.nbytes
        pinv = np.ascontiguousarray(pinv, st.dtype)
        cl.enqueue_copy(st.rt.queue, pcg.Pinv.data, pinv)
        st.bytes_to_device += pinv.nbytes


class DeviceExplicitSchur:
    """The reduced camera system on the device:
    :class:`solvers.linalg.sparse_schur_device.DeviceSparseSchur` assembles it and factorises it
    where it is fastest, dense where the entry says so (one iteration, the host path's messages)."""

    def __init__(self, state, entry):
        from .sparse_schur_device import DeviceSparseSchur
        self.st = st = state
        ev, dev = st.ev, st.ev.device_observations
        if dev is not None:
            # Ordered on the device: the pattern is made there, the host copies read back only
            # if it cannot be (solvers.linalg.schur_pattern_device).
            cam = pt = camera_order = None
        else:
            cam, pt, camera_order = ev.cam, ev.pt, ev.camera_order()
        self.system = DeviceSparseSchur(st.rt, cam, pt, st.nc, st.npt, st.C, st.P, st.R,
                                        other_bytes=st.bytes_needed, events=st.events,
                                        camera_order=camera_order, copies=st.copies,
                                        pattern=ev.reduced_pattern, dense=entry.dense, device_observations=dev,
                                        mixed=st.o.mixed_precision_solves)
        self.description = self.system.description

    @staticmethod
    def program_requests(runtime, C, P, R, nc, other_bytes, entry, device_setup=False, mixed=None):
        """The programs it will build, for :func:`clkernels.templates.prefetch` (a guess where the
        factorisation's place depends on the pattern, which is made later). ``device_setup``: the
        observations are ordered on the device, and the pattern is made there; ``mixed``: the
        option ``mixed_precision_solves``."""
        from .sparse_schur_device import DeviceSparseSchur
        return DeviceSparseSchur.program_requests(runtime, C, P, R, nc, other_bytes, entry.dense, device_setup,
                                                  mixed)

    @property
    def nbytes(self):
        return self.system.nbytes

    @property
    def bytes_to_device(self):
        return self.system.bytes_to_device

    @property
    def bytes_to_host(self):
        return self.system.bytes_to_host

    def solve(self):
        """``(ok, 1, message)``; ok is None when the verdict is read later (:meth:`outcome`)."""
        st, pcg = self.st, self.st.pcg
        ok, msg = self.system.solve(st.jc, st.jp, pcg.Vinv, st.B, pcg.dc2, st.g[0], pcg.gp, pcg.x,
                                    defer=True)
        return ok, 1, msg

    def outcome(self):
        return self.system.outcome()

    def close(self):
        self.system.close()


_SOLVERS = {
    s.name: s for s in (
        LinearSolver("sparse_schur", host=HostExplicitSchur, device=DeviceExplicitSchur,
                     dtypes=(np.float64,)),      # assembled and factorised in float64
        # Ceres' DENSE_SCHUR: the reduced camera matrix factorised dense (Cholesky) at any size:
        # by the device's dense Cholesky where it fits there, else by LAPACK on the host.
        LinearSolver("dense_schur", host=HostExplicitSchur, device=DeviceExplicitSchur, dtypes=(np.float64,),
                     dense=True),
        LinearSolver("iterative_schur", host=HostIterativeSchur, device=DeviceIterativeSchur, iterative=True,
                     preconditioner="SCHUR_JACOBI"),
        # Nothing eliminated: J^T J + D^2 factorised whole; only solvers.general.sparse_state runs it.
        LinearSolver("sparse_normal_cholesky", host=None, device=None, dtypes=(), eliminates=False),
    )
}
LINEAR_SOLVERS = tuple(_SOLVERS)
"""The names ``linear_solver=`` takes: ``sparse_schur``, ``dense_schur``, ``iterative_schur``, ``sparse_normal_cholesky``."""
SCHUR_METHODS = tuple(name for name, s in _SOLVERS.items() if s.eliminates)


def linear_solver(name: str) -> LinearSolver:
    """The method called ``name``; a ValueError that lists the choices for any other name."""
    try:
        return _SOLVERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"linear_solver={name!r} is not one of {LINEAR_SOLVERS}") from None
