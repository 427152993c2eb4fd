"""Moved: the target layer is chaoskit.executors.layer. This name stays only until engine/plan.py and
engine/faults.py import `place` from there (it is the one import left that breaks the layer contract here)."""

from chaoskit.executors.layer import place

__all__ = ["place"]
