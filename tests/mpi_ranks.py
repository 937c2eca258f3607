"""Runs commands under Open MPI's real ``mpirun`` for the tests of split solves, rank faults and
recorded logs. Missing mpirun or mpi4py skips the test on a user's machine and fails it where
``PYCLAD_REQUIRE_MPI=1`` (CI installs both), so a missing MPI can hide nothing."""
import os
import shutil
import subprocess

import pytest

from pocl_pair import ROOT


def mpirun() -> str:
    """The path of ``mpirun``, with mpi4py importable (else skip, or fail under CI)."""
    exe = shutil.which("mpirun")
    try:
        import mpi4py  # noqa: F401 - only whether it imports
    except ImportError:
        exe = None
    if exe is None:
        message = "needs Open MPI's mpirun (apt-get install openmpi-bin libopenmpi-dev) and mpi4py"
        if os.environ.get("PYCLAD_REQUIRE_MPI") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return exe


def mpi_env() -> dict:
    """The ranks' environment: root and more ranks than cores allowed (CI containers), the
    checkout importable, and no device pinned by the caller (each rank picks its own)."""
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1",
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("PYCLAD_DEVICE", None)
    return env


def run_ranks(args, timeout: float, env=None) -> subprocess.CompletedProcess:
    """``mpirun ARGS`` from the checkout, output captured as text."""
    return subprocess.run([mpirun(), *args], capture_output=True, text=True, cwd=ROOT,
                          env=env or mpi_env(), timeout=timeout)
