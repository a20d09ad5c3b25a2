"""Circular padding of the scan layout (issue 30, part 4): the maps of a periodic scan shift with
the scan, old cards load as zeros, the reach of the padding is exact, and tiles of a microscope
scan ignore the pixels within that reach of an inner tile border."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from models import ModelConfig, build_model
from models.card import ArchitectureSpec, validate_card
from models.errors import ModelDirError
from models.config import Architecture
from models.fcdensenet import edge_reach
from models.scan_fit import Stitcher, tile_grid
from models.scan_fit.tiles import axis_windows, tile_margin
from models.weights_check import expected_tensors
from workflow.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]
SHIPPED_CARD = REPO / "models" / "pretrained" / "study-scan" / "model_card.json"
#: a small scan-layout network: 8 x 8 scans of 8 px patterns binned to 4 x 4, two levels (stride 4)
SMALL_SCAN = dict(preset="scan", in_channels=64, pattern_bins=4, init_channels=8, growth_rate=4)


def _model(padding_mode: str, **cfg) -> torch.nn.Module:
    """A float64 network in eval mode whose batch norms have non-trivial running statistics."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(padding_mode=padding_mode, **cfg)).double()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
    return model.eval()


def _roll_scan(x: torch.Tensor, scan: tuple[int, int], shift: tuple[int, int]) -> torch.Tensor:
    """Roll the (B, S, P, P) stack's scan index, viewed as (scan_y, scan_x), by ``shift``."""
    b, s, p, _ = x.shape
    return x.reshape(b, *scan, p, p).roll(shift, dims=(1, 2)).reshape(b, s, p, p)


@pytest.mark.parametrize("tu_kernel", [1, 3, 4])
def test_a_periodic_shift_of_the_scan_shifts_the_maps_with_circular_padding(tu_kernel):
    """Shifts by multiples of the total stride 2**levels = 4, on both axes; tu_kernel > tu_stride
    exercises the transposed conv's circular fold."""
    x = torch.rand(2, 64, 8, 8, dtype=torch.float64)
    for mode, equivariant in (("circular", True), ("zeros", False)):
        model = _model(mode, **SMALL_SCAN, tu_kernel=tu_kernel)
        with torch.no_grad():
            y = model(x)
            for shift in ((4, 0), (0, -4), (4, 4)):
                shifted = model(_roll_scan(x, (8, 8), shift))
                same = torch.allclose(shifted, y.roll(shift, dims=(2, 3)), rtol=1e-10, atol=1e-12)
                assert same == equivariant, (mode, shift)


def test_circular_and_zeros_padding_agree_beyond_the_edge_reach():
    """Same weights: the two paddings give the same maps on pixels at least `edge_reach` from every
    edge (the circular fold puts the transposed conv's overhang nowhere else), and differ nearer."""
    cfg = dict(preset="tiny", in_channels=3, levels=1, layers_per_block=[1, 1, 1], tu_kernel=3)
    circular, zeros = _model("circular", **cfg), _model("zeros", **cfg)
    zeros.load_state_dict(circular.state_dict())
    r = edge_reach(circular.arch)
    x = torch.rand(1, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        a, b = circular(x), zeros(x)
    inner = (slice(None), slice(None), slice(r, 32 - r), slice(r, 32 - r))
    torch.testing.assert_close(a[inner], b[inner], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(a[..., r - 1, :], b[..., r - 1, :])   # the last row within reach sees the padding


@pytest.mark.parametrize("overrides", [
    dict(),                                                      # tiny: 2 levels, 3 x 3
    dict(tu_kernel=3), dict(tu_kernel=4, skip=False),
    dict(levels=1, layers_per_block=[1, 2, 1], tu_kernel=5, tu_stride=3),
    dict(levels=0, layers_per_block=[3], kernel_size=5, stem_kernel=3),
])
def test_edge_reach_is_the_exact_receptive_field_half_width(overrides):
    """With positive weights and inputs every ReLU passes, so the gradient of one output pixel is
    non-zero exactly on the inputs it depends on; the widest over the pooling alignments is the reach."""
    model = _model("zeros", preset="tiny", in_channels=2, **overrides)
    with torch.no_grad():
        for param in model.parameters():
            param.abs_()
    reach, n = 0, 72
    for offset in range(model.arch.size_multiple):
        x = (torch.rand(1, 2, n, n, dtype=torch.float64) + 0.5).requires_grad_(True)
        c = n // 2 + offset
        model(x)[0, 0, c, c].backward()
        rows, cols = (torch.nonzero(x.grad[0].abs().sum(dim=(0, axis))).flatten() for axis in (2, 1))
        reach = max(reach, c - int(rows.min()), int(rows.max()) - c, c - int(cols.min()), int(cols.max()) - c)
    assert reach < n // 2 - 1   # the input was wide enough to see it whole
    assert edge_reach(model.arch) == reach


def test_presets_padding_and_overrides():
    assert ModelConfig(preset="scan").architecture().padding_mode == "circular"
    for preset in ("paper", "small", "tiny"):
        assert ModelConfig(preset=preset).architecture().padding_mode == "zeros"
    assert ModelConfig(preset="scan", padding_mode="zeros").architecture().padding_mode == "zeros"
    assert ModelConfig(preset="tiny", padding_mode="circular").architecture().padding_mode == "circular"
    model = build_model(ModelConfig(preset="scan"))
    assert model.down_blocks[0].layers[0][-1].padding_mode == "circular"
    cfg = load_config(REPO / "configs" / "quickstart.yaml", ["model.padding_mode=zeros"])
    assert cfg.model.architecture().padding_mode == "zeros"
    assert load_config(REPO / "configs" / "quickstart.yaml").model.architecture().padding_mode == "circular"


def test_bad_padding_modes_are_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        load_config(REPO / "configs" / "quickstart.yaml", ["model.padding_mode=reflect"])
    assert "padding_mode" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValidationError):
        ModelConfig(padding_mode="reflect")
    card = json.loads(SHIPPED_CARD.read_text())
    card["architecture"]["padding_mode"] = "reflect"
    with pytest.raises(ModelDirError) as err:
        validate_card(card, "card.json")
    assert "architecture.padding_mode" in str(err.value) and "\n" not in str(err.value)


def test_cards_without_padding_mode_load_as_zeros():
    """The shipped card predates padding_mode: its scan-layout weights were trained with zeros."""
    card = json.loads(SHIPPED_CARD.read_text())
    assert "padding_mode" not in card["architecture"] and card["model_config"]["preset"] == "scan"
    arch = validate_card(card, "card").architecture.architecture()
    assert arch.padding_mode == "zeros" and arch.input_layout == "scan"
    assert Architecture.from_dict(card["architecture"]).padding_mode == "zeros"
    from models import load_reconstructor

    model = load_reconstructor("pretrained:study-scan").model
    assert {m.padding_mode for m in model.modules() if isinstance(m, torch.nn.Conv2d)} == {"zeros"}
    circular = ModelConfig(preset="scan").architecture()
    assert Architecture.from_dict(circular.to_dict()) == circular
    assert ArchitectureSpec.model_validate(circular.to_dict()).architecture() == circular


def test_the_weights_header_check_does_not_depend_on_the_padding():
    for cfg in (dict(preset="scan"), dict(preset="tiny", tu_kernel=3)):
        circular = ModelConfig(padding_mode="circular", **cfg).architecture()
        zeros = ModelConfig(padding_mode="zeros", **cfg).architecture()
        assert expected_tensors(circular) == expected_tensors(zeros)


# --- tiles of a microscope scan ---------------------------------------------------------------

def test_tile_margin_is_the_reach_capped_at_a_quarter_tile():
    scan = ModelConfig(preset="scan").architecture()
    assert edge_reach(scan) == 35 and tile_margin(scan, 32) == 8
    shallow = ModelConfig(preset="scan", levels=1, layers_per_block=[1, 1, 1]).architecture()
    assert tile_margin(shallow, 32) == edge_reach(shallow) < 8
    assert tile_margin(ModelConfig(preset="tiny").architecture(), 16) == 0   # patterns layout


def test_windows_ignore_the_margin_at_inner_borders_and_ramps_sum_to_one():
    windows = axis_windows((0, 16, 32), 32, margin=5)
    first, middle, last = windows
    assert first[0] == 1 and last[-1] == 1                      # outer borders of the scan: one tile
    assert np.all(first[-5:] == 0) and np.all(middle[:5] == 0) and np.all(middle[-5:] == 0) and np.all(last[:5] == 0)
    np.testing.assert_allclose(first[16:] + middle[:16], 1.0)  # the overlap of the first two tiles
    hard = axis_windows((0, 16), 32, margin=8)                  # overlap 16 = 2 margins: a hard switch
    np.testing.assert_array_equal(hard[0][16:] + hard[1][:16], 1.0)
    grid = tile_grid((64, 64), (32, 32), 32, margin=10)         # 2 x 10 px need a stride <= 12
    assert np.all(np.diff(grid.origins_y) <= 12) and grid.covered == (64, 64)
    with pytest.raises(ValueError, match="leaves no overlap"):
        tile_grid((64, 64), (32, 32), 32, margin=16)


def test_the_stitched_interior_does_not_depend_on_the_padding():
    """A non-periodic random scan of 72 x 80 positions, tiles of 32 x 32: stitched with the margin,
    the maps of a circular and a zeros padded network (same weights) agree everywhere but on the
    outer ring that only one tile covers; without the margin they differ inside too."""
    cfg = dict(SMALL_SCAN, in_channels=1024, pattern_bins=2, levels=1, layers_per_block=[1, 1, 1])
    circular, zeros = _model("circular", **cfg), _model("zeros", **cfg)
    zeros.load_state_dict(circular.state_dict())
    margin = tile_margin(circular.arch, 32)
    assert margin == edge_reach(circular.arch) > 0
    scan = np.random.default_rng(1).random((72, 80, 4, 4))

    def stitched(model: torch.nn.Module, margin: int) -> np.ndarray:
        grid = tile_grid(scan.shape[:2], (32, 32), 32, margin=margin)
        origins = [(oy, ox) for oy in grid.origins_y for ox in grid.origins_x]
        tiles = np.stack([scan[oy:oy + 32, ox:ox + 32].reshape(1024, 4, 4) for oy, ox in origins])
        with torch.no_grad():
            maps = model(torch.from_numpy(tiles)).numpy()
        stitcher = Stitcher(1, grid)
        for origin, tile_maps in zip(origins, maps):
            stitcher.add(tile_maps, origin)
        return stitcher.result()[0]

    a, b = stitched(circular, margin), stitched(zeros, margin)
    inner = (slice(margin, -margin), slice(margin, -margin))
    np.testing.assert_allclose(a[inner], b[inner], rtol=1e-6, atol=1e-6 * np.abs(b).max())
    assert np.abs(a - b)[:margin].max() > 1e-3 * np.abs(b).max()        # the outer ring: padded
    a0, b0 = stitched(circular, 0), stitched(zeros, 0)
    assert np.abs(a0 - b0)[inner].max() > 1e-3 * np.abs(b0).max()
