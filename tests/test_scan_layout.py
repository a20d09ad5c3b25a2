"""The scan-space input layout (Friedrich et al. 2022): shapes, the order of patterns and bins, and
its agreement with the physical scan of a real simulated sample."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import namsa
from models import ModelConfig, ModelConfigError, build_model
from models.config import Architecture
from models.fcdensenet import ScanSpaceInput
from workflow.config import ConfigError, load_config


def test_scan_preset_maps_a_stack_to_maps_of_the_scan_size():
    model = build_model(ModelConfig(preset="scan", targets=["potential", "density"])).eval()
    assert model.arch.scan_shape == (32, 32) and model.stem.in_channels == 16 * 16
    with torch.no_grad():
        out = model(torch.rand(2, 1024, 32, 32))
    assert out.shape == (2, 2, 32, 32)
    # any pattern size that the bins divide works; the map keeps the scan's size
    small = build_model(ModelConfig(preset="scan", in_channels=64, pattern_bins=4, levels=1,
                                    layers_per_block=[1, 1, 1])).eval()
    with torch.no_grad():
        assert small(torch.rand(1, 64, 12, 12)).shape == (1, 1, 8, 8)


def test_patterns_land_at_their_probe_position_and_bins_keep_k_order():
    sy, sx, p, b = 4, 6, 8, 4
    layout = ScanSpaceInput((sy, sx), b)
    x = torch.zeros(1, sy * sx, p, p)
    for s in range(sy * sx):
        x[0, s] = s                                   # pattern s carries its own index
    out = layout(x)
    assert out.shape == (1, b * b, sy, sx)
    expected = torch.arange(sy * sx, dtype=torch.float32).reshape(sy, sx)   # row-major scan
    assert torch.equal(out[0, 0], expected) and torch.equal(out[0, -1], expected)
    one = torch.zeros(1, sy * sx, p, p)
    one[0, 7, 2 * 2, 3 * 2] = 4.0                     # ky bin 2, kx bin 3 of pattern 7 = (row 1, col 1)
    hit = (layout(one)[0] != 0).nonzero().tolist()
    assert hit == [[2 * b + 3, 1, 1]]
    assert layout(one)[0, 2 * b + 3, 1, 1] == pytest.approx(1.0)          # average over the 2 x 2 bin


def test_scan_layout_agrees_with_the_physical_scan_of_a_real_sample():
    """The annular dark-field image read off the layout's outer bins must look like the projected
    potential at the same pixels (heavy columns scatter to high angles); with the scan axes
    transposed it must not. SrTiO3 [001]: Sr and Ti-O columns, a non-square-symmetric fov."""
    cfg = namsa.SimulationConfig(scan_shape=(16, 16), pattern_px=16, target_px=16, cell_lateral_A=8.0,
                                 thickness_A=20.0, sampling_A=0.15, scan_fov_A=(0.0, 0.0, 7.81, 3.905))
    sample = namsa.simulate_sample("SrTiO3-perovskite", (0, 0, 1), cfg)
    positions = np.asarray(sample.meta.scan_positions_A).reshape(16, 16, 2)
    assert np.all(np.diff(positions[..., 0], axis=0) > 0) and np.all(np.diff(positions[..., 1], axis=1) > 0)
    binned = ScanSpaceInput((16, 16), 8)(torch.from_numpy(sample.cbed)[None])[0].numpy()
    ky, kx = np.divmod(np.arange(64), 8)
    outer = np.hypot(ky - 3.5, kx - 3.5) > 2.5                 # bins beyond the bright-field disc
    adf = binned[outer].sum(axis=0)
    truth = sample.potential
    r = np.corrcoef(adf.ravel(), truth.ravel())[0, 1]
    r_transposed = np.corrcoef(adf.T.ravel(), truth.ravel())[0, 1]
    assert r > 0.6 and r > r_transposed + 0.3, (r, r_transposed)


def test_cards_written_before_the_scan_layout_still_load():
    arch = ModelConfig(preset="tiny").architecture()
    old_card = {k: v for k, v in arch.to_dict().items() if k not in ("input_layout", "pattern_bins", "scan_shape")}
    assert Architecture.from_dict(old_card) == arch
    scan = ModelConfig(preset="scan").architecture()
    assert Architecture.from_dict(scan.to_dict()) == scan


@pytest.mark.parametrize("overrides, message", [
    (dict(in_channels=1000), "not a square scan"),
    (dict(in_channels=64, scan_shape=[4, 8]), "holds 32 positions"),
    (dict(stem_kernel=2), r"model.stem_kernel=2 must be odd"),
    (dict(stem_kernel=0, kernel_size=4), r"model.kernel_size=4 must be odd"),
])
def test_inconsistent_scan_settings_are_refused(overrides, message):
    with pytest.raises(ModelConfigError, match=message):
        ModelConfig(preset="scan", **overrides).architecture()


@pytest.mark.parametrize("sets, message", [
    (["simulation.target_px=16"], "set simulation.target_px to the scan size"),
    (["simulation.pattern_px=24"], "not a multiple of model.pattern_bins=16"),
    (["simulation.scan_shape=[30, 30]", "model.in_channels=900", "simulation.target_px=30"], "not a multiple of 4"),
    (["model.preset=small", "simulation.target_px=16"], "or model.input_layout: scan"),
])
def test_pipeline_config_checks_data_against_the_layout(tmp_path, sets, message):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  preset: scan\nsimulation:\n  scan_shape: [32, 32]\n  pattern_px: 32\n  target_px: 32\n")
    load_config(path)  # consistent as written
    with pytest.raises(ConfigError, match=message):
        load_config(path, sets)


def test_a_non_square_scan_runs_forward():
    """The forward check looks at the input alone: a 4 x 8 scan (maps 4 x 8) is a valid input."""
    model = build_model(ModelConfig(preset="scan", in_channels=32, scan_shape=[4, 8], levels=2,
                                    pattern_bins=4).architecture())
    assert model(torch.rand(2, 32, 16, 16)).shape == (2, 1, 4, 8)
