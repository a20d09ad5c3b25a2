"""Which samples the evaluation runs multislice ptychography on (minutes per sample): a subset rule
of `evaluation.methods`, picking thick samples in scoring order."""
from __future__ import annotations

from namsa.ptychography.multislice import MultisliceSettings
from namsa.sample_meta import SampleMeta


class ThickSubset:
    """Which samples get multislice ptychography: the first ``settings.max_samples`` eligible ones
    (thick enough, `MultisliceSettings.eligible`) in the order they are scored."""

    def __init__(self, settings: MultisliceSettings) -> None:
        self.settings = settings
        self.taken = 0

    def take(self, meta: SampleMeta) -> bool:
        """True (and counted) when the sample with this meta gets the multislice baseline."""
        due = self.taken < self.settings.max_samples and self.settings.eligible(meta)
        self.taken += due
        return due

    def note(self) -> str:
        """What each of its fit records says: its aggregates cover only this subset."""
        return (f"scored on a subset: the first {self.settings.max_samples} samples at least "
                f"{self.settings.min_thickness_A:g} A thick")
