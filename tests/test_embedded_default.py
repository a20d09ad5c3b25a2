"""The embedded default config (workflow/quickstart.yaml, shipped in the package) is a real file with
the bytes of configs/quickstart.yaml: a symlink would reach a zip download or a Windows checkout as a
26-byte path, and a drifted copy would make `namsa run` without a config differ from `make demo`."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_embedded_default_is_a_real_copy_of_the_quickstart():
    embedded = REPO / "workflow" / "quickstart.yaml"
    assert not embedded.is_symlink(), "workflow/quickstart.yaml must be a real file (cp configs/quickstart.yaml)"
    assert embedded.read_bytes() == (REPO / "configs" / "quickstart.yaml").read_bytes(), \
        "workflow/quickstart.yaml differs from configs/quickstart.yaml: copy the one you changed over the other"
