"""Sparse4D's deformable aggregation, forward and backward (:mod:`.aggregation`), and
``feature_maps_format`` (:mod:`.format`), which packs per-scale feature maps into the layout the
aggregation reads. One template, ``deformable_aggregation.cl.mako`` beside them, holds the
kernels of both ops (``KIND`` chooses)."""
from .aggregation import (AggregationConfig, default_config,  # noqa: F401
                          deformable_aggregation, deformable_aggregation_backward,
                          deformable_aggregation_torch, enqueue_backward, enqueue_forward)
from .format import feature_maps_format  # noqa: F401

__all__ = ["deformable_aggregation", "deformable_aggregation_backward", "feature_maps_format",
           "AggregationConfig", "default_config", "enqueue_forward", "enqueue_backward",
           "deformable_aggregation_torch"]


def __getattr__(name):
    if name == "DeformableAggregationFunction":  # made on first use: torch is optional
        from . import aggregation
        return aggregation.DeformableAggregationFunction
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
