"""Workloads: real prompts and request traces to drive the engine with."""

from minengine.workloads.prompts import SHAKESPEARE_OPENINGS, find_data_dir, load_real_prompts

__all__ = ["SHAKESPEARE_OPENINGS", "find_data_dir", "load_real_prompts"]
