"""The Sample contract shared by namsa (produces), stage (stores) and models (consumes).

Array axis convention everywhere: ``[row = y, col = x]``; the scan index runs row-major over
``scan_shape = (scan_y, scan_x)``, so pattern ``s`` was taken at scan row ``s // scan_x``,
column ``s % scan_x``.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import UserError

#: keys every ``Sample.meta`` carries (JSON-serialisable values).
REQUIRED_META_KEYS: tuple[str, ...] = (
    "sample_id",          # str, from namsa.material_id.sample_id()
    "material_id",        # str, stable id of the structure (library id or CIF stem)
    "formula",            # str, reduced formula
    "elements",           # list[str], element symbols present
    "zone_axis",          # list[int] [u, v, w]
    "variant",            # int, variant index (frozen phonon / tilt / defocus draw)
    "thickness_A",        # float, specimen thickness along the beam (Angstrom)
    "energy_kv",          # float, beam energy (kV)
    "semiangle_mrad",     # float, probe-forming aperture semi-angle (mrad)
    "aberrations",        # dict[str, float], e.g. {"C1_A": 0.0, "C3_mm": 0.0}
    "sampling_A",         # [dy, dx] real-space sampling of the simulation grid (Angstrom/pixel)
    "scan_shape",         # [scan_y, scan_x]
    "scan_positions_A",   # list of [y, x] probe positions (Angstrom), row-major, len = S
    "fov_A",              # [y0, x0, height, width] scanned field of view (Angstrom)
    "seed",               # int, random seed of this sample
    "code_version",       # str, namsa.__version__
    "config_hash",        # str, SimulationConfig.physics_hash()
)


def config_hash(payload: dict[str, Any]) -> str:
    """sha256 of a canonical JSON rendering of ``payload`` (sorted keys)."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Sample:
    """One simulated 4D-STEM measurement and its targets.

    cbed:      (S, P, P) float, S = scan_y * scan_x; k = 0 at index P // 2; each pattern is the
               far-field intensity normalised so the incident probe carries total intensity 1.
    potential: (T, T) float32, projected potential (V * Angstrom) over the scanned field of view.
    density:   (T, T) float32, projected electron density (electrons / Angstrom^2), same field.
    meta:      JSON-serialisable dict with at least REQUIRED_META_KEYS.
    """

    cbed: np.ndarray
    potential: np.ndarray
    density: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return str(self.meta["sample_id"])

    def validate(self) -> "Sample":
        """Check shapes, dtypes and required metadata; raise UserError naming what is wrong."""
        missing = [k for k in REQUIRED_META_KEYS if k not in self.meta]
        if missing:
            raise UserError(f"sample meta is missing keys {missing}; build samples with namsa.simulate_sample")
        if self.cbed.ndim != 3 or self.cbed.shape[1] != self.cbed.shape[2]:
            raise UserError(f"sample {self.meta['sample_id']}: cbed must be (S, P, P), got {self.cbed.shape}")
        sy, sx = self.meta["scan_shape"]
        if self.cbed.shape[0] != sy * sx:
            raise UserError(f"sample {self.meta['sample_id']}: cbed has {self.cbed.shape[0]} patterns "
                            f"but scan_shape {sy}x{sx} needs {sy * sx}")
        for name in ("potential", "density"):
            arr = getattr(self, name)
            if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
                raise UserError(f"sample {self.meta['sample_id']}: {name} must be (T, T), got {arr.shape}")
        if self.potential.shape != self.density.shape:
            raise UserError(f"sample {self.meta['sample_id']}: potential {self.potential.shape} and "
                            f"density {self.density.shape} differ in shape")
        return self
