"""namsa: multislice simulation of 4D-STEM CBED stacks and their projected targets (physics only)."""
from __future__ import annotations

from .version import __version__

from .errors import NamsaError, RunError, UserError
from .material_id import sample_id
from .sample import Sample, SampleMeta
from .config import SimulationConfig
from .plan import Plan, SampleSpec, plan_samples
from .simulate import simulate_cbed, simulate_sample


_LAZY_SUBMODULES = ("library", "structure_io", "supercell", "zone_axes", "thermal", "periodic",
                    "potential", "optics", "targets", "kirkland", "multislice", "backend", "constants")


def __getattr__(name: str):
    # namsa.load_structure is namsa.structure_io.load_structure, and submodules such as
    # namsa.library are imported on first use, so that `import namsa` (and the stage/models rooms
    # that only need Sample) do not pay for pymatgen.
    import importlib

    if name == "load_structure":
        return importlib.import_module(".structure_io", __name__).load_structure
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'namsa' has no attribute {name!r}")


__all__ = ["__version__", "NamsaError", "UserError", "RunError", "Sample", "SampleMeta", "sample_id", "SimulationConfig", "load_structure",
           "simulate_cbed", "simulate_sample", "plan_samples", "Plan", "SampleSpec"]
