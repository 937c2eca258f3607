"""pyclad: batched reverse-mode automatic differentiation compiled to OpenCL.

Write a plain Python function of short vectors; pyclad traces it once into a graph
(constant folding and common-subexpression elimination as it goes) and compiles it into
an OpenCL kernel that evaluates the values and Jacobians for millions of input tuples at
once::

    import numpy as np, pyclad as pc

    def reprojection(camera, point, observed):
        p = pc.rotate_angle_axis(camera[0:3], point) + camera[3:6]
        ...
        return [u - observed[0], v - observed[1]]

    f = pc.BatchFunction(reprojection, params=(9, 3), data=2)
    r, (J_cam, J_pt) = f.values_and_jacobians([cameras, points], index, data=observed)

Operations (:mod:`pyclad.ops` holds the table): ``+ - * / ** -x abs``, comparisons,
``& | ~`` on conditions, ``sin cos tan asin acos atan atan2 exp log sqrt pow tanh minimum
maximum where``; on vectors ``dot cross norm rotate_angle_axis`` and elementwise
arithmetic. Python ``if`` on a traced value is an error that points to :func:`where`.
"""
from .batch import BACKENDS, BatchFunction
from .graph import Node
from .tape import TapeConfig
from .trace import Traced, trace
from .vector import ANGLE_AXIS_EPSILON, FUNCTIONS, Vector, cross, dot, norm, rotate_angle_axis, vector

# The elementwise functions (pc.sin, ..., pc.abs, pc.where): one per row of the op table
# (pyclad/ops.py) that names one.
globals().update(FUNCTIONS)

__all__ = ["BatchFunction", "BACKENDS", "TapeConfig", "Node", "Traced", "trace", "Vector", "vector", *FUNCTIONS,
           "dot", "cross", "norm", "rotate_angle_axis", "ANGLE_AXIS_EPSILON"]
