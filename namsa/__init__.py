"""namsa: multislice simulation of 4D-STEM CBED stacks and their projected targets (physics only)."""
from __future__ import annotations

__version__ = "0.1.0"

from .errors import UserError
from .sample import Sample, sample_id
from .config import SimulationConfig
from .simulate import Plan, SampleSpec, plan_samples, simulate_cbed, simulate_sample


def __getattr__(name: str):
    # namsa.load_structure is namsa.structures.load_structure, imported on first use so that
    # `import namsa` (and the stage/models rooms that only need Sample) do not pay for pymatgen.
    if name == "load_structure":
        from .structures import load_structure

        return load_structure
    raise AttributeError(f"module 'namsa' has no attribute {name!r}")


__all__ = ["__version__", "UserError", "Sample", "sample_id", "SimulationConfig", "load_structure",
           "simulate_cbed", "simulate_sample", "plan_samples", "Plan", "SampleSpec"]
