"""namsa: multislice simulation of 4D-STEM CBED stacks and their projected targets (physics only)."""
from __future__ import annotations

__version__ = "0.1.0"

from .errors import UserError
from .sample import Sample, sample_id

__all__ = ["__version__", "UserError", "Sample", "sample_id"]
