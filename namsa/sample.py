"""The Sample contract shared by namsa (produces), stage (stores) and models (consumes).

Array axis convention everywhere: ``[row = y, col = x]``; the scan index runs row-major over
``scan_shape = (scan_y, scan_x)``, so pattern ``s`` was taken at scan row ``s // scan_x``,
column ``s % scan_x``.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import UserError
from .sample_meta import REQUIRED_META_KEYS, SampleMeta


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
    meta:      `SampleMeta` (namsa.sample_meta), every field of REQUIRED_META_KEYS known.
    """

    cbed: np.ndarray
    potential: np.ndarray
    density: np.ndarray
    meta: SampleMeta

    @property
    def id(self) -> str:
        """The sample's id (`namsa.material_id.sample_id`); a UserError for a meta without one."""
        if self.meta.sample_id is None:
            raise UserError("this sample's meta has no sample_id (a microscope scan); build samples with "
                            "namsa.simulate_sample")
        return str(self.meta.sample_id)

    def validate(self) -> "Sample":
        """Check shapes, dtypes and required metadata; raise UserError naming what is wrong."""
        if not isinstance(self.meta, SampleMeta):
            raise UserError(f"sample meta must be a namsa.sample_meta.SampleMeta, got {type(self.meta).__name__}; "
                            f"build samples with namsa.simulate_sample")
        missing = self.meta.missing(REQUIRED_META_KEYS)
        if missing:
            raise UserError(f"sample meta is missing keys {missing}; build samples with namsa.simulate_sample")
        if self.cbed.ndim != 3 or self.cbed.shape[1] != self.cbed.shape[2]:
            raise UserError(f"sample {self.id}: cbed must be (S, P, P), got {self.cbed.shape}")
        sy, sx = self.meta.scan_shape
        if self.cbed.shape[0] != sy * sx:
            raise UserError(f"sample {self.id}: cbed has {self.cbed.shape[0]} patterns "
                            f"but scan_shape {sy}x{sx} needs {sy * sx}")
        for name in ("potential", "density"):
            arr = getattr(self, name)
            if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
                raise UserError(f"sample {self.id}: {name} must be (T, T), got {arr.shape}")
        if self.potential.shape != self.density.shape:
            raise UserError(f"sample {self.id}: potential {self.potential.shape} and "
                            f"density {self.density.shape} differ in shape")
        return self


__all__ = ["Sample", "SampleMeta", "REQUIRED_META_KEYS", "config_hash"]
