"""Every loop state declares solvers.loop.step.LoopState and defines each of its members itself: a
member left to the protocol's empty body would answer None where the minimizer expects a value.
Data members (``where``, ``linear_solver_time``) are set by the class or its ``__init__``; and a
real solve on each path the CPU machine can run returns what the minimizer reads."""
import ast
import inspect
import textwrap

import numpy as np
import pytest

import solvers
from solvers.ba.host_state import HostState
from solvers.ba.lm_device import DeviceState
from solvers.split.partitioned import PartitionedState
from solvers.split.partitioned_device import PartitionedDeviceState
from solvers.general.sparse_state import SparseState
from solvers.loop.step import LoopState

STATES = [HostState, DeviceState, SparseState, PartitionedState, PartitionedDeviceState]
DATA = {"where", "linear_solver_time"}


def members():
    names = {n for n, v in vars(LoopState).items()
             if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    return names | DATA


def assigned_in_init(cls):
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))
    return {t.attr for node in ast.walk(tree) if isinstance(node, ast.Assign) for t in node.targets
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}


def test_the_protocol_lists_what_the_minimizer_reads():
    assert members() == {"where", "linear_solver_time", "evaluate_jacobian", "solve_step", "evaluate_candidate",
                         "accept", "x_norm", "remember_best", "best", "transfers", "kernel_time",
                         "linear_solver_detail", "close"}


@pytest.mark.parametrize("cls", STATES, ids=lambda c: c.__name__)
def test_each_state_defines_every_member_itself(cls):
    assert LoopState in cls.__mro__
    own = set(vars(cls)) | assigned_in_init(cls)
    missing = sorted(members() - own)
    assert missing == [], f"{cls.__name__} leaves {missing} to the protocol"
    for name in members() - DATA:
        ours, theirs = vars(cls)[name], vars(LoopState)[name]
        assert isinstance(ours, property) == isinstance(theirs, property), name


def test_the_checks_find_a_member_left_to_the_protocol():
    class Partial(LoopState):
        where = "host"

        def __init__(self):
            self.linear_solver_time = 0.0

        def accept(self):
            pass

    missing = members() - (set(vars(Partial)) | assigned_in_init(Partial))
    assert "solve_step" in missing and "accept" not in missing and "linear_solver_time" not in missing


@pytest.mark.parametrize("kind", ["host", "device"])
def test_a_solve_on_each_path_reports_through_the_protocol(device, kind):
    p = solvers.synthetic_problem(6, 60, 3, seed=2)
    extra = dict(schur_backend="numpy", device_resident=False) if kind == "host" else dict(device=device)
    r = solvers.bundle_adjust(p, max_iterations=3, handle_sigint=False, **extra)
    assert r.state == ("host" if kind == "host" else "device")
    assert np.isfinite(r.final_cost) and r.times["linear_solver"] >= 0.0
    assert isinstance(r.transfers, dict)
