"""Tensor parallelism: the process group (group.py) and how each kind of weight splits (sharding.py)."""

from hybrid_sgl.distributed.group import SINGLE, TPGroup, building_with, current_tp, destroy_tp, init_tp

__all__ = ["SINGLE", "TPGroup", "building_with", "current_tp", "destroy_tp", "init_tp"]
