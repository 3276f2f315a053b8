"""Accelerator template, area model, search space and presets (plain Python, no Ray)."""

from .accelerator import Accelerator

__all__ = ["Accelerator"]
