"""FC-DenseNet: the paper preset's exact counts, configurability, blocks(), shapes and bad input."""
from __future__ import annotations

import pytest
import torch

from models import ModelConfig, ModelConfigError, build_model, count_parameters
from models.flops import TRAIN_STEP_FACTOR, forward_conv_ops
from _train_helpers import one_thread  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

PAPER_PARAMS = 220_399_104          # Laanait et al. 2019 via FACTS.md
PAPER_FORWARD_OPS = 1.7170e13       # at 1024 x 512 x 512, 5 significant digits
PAPER_STEP_OPS = 5.1510e13          # 3x forward, as the paper counts


def _meta_model(**overrides):
    with torch.device("meta"):
        return build_model(ModelConfig(**overrides))


def test_paper_preset_parameter_and_flop_counts():
    model = _meta_model(preset="paper")
    assert count_parameters(model) == PAPER_PARAMS
    ops = forward_conv_ops(model, (1024, 512, 512))
    assert ops == 17_169_802_854_400  # eq. 1 summed over every conv, exact integer
    assert round(ops / 1e13, 4) == pytest.approx(PAPER_FORWARD_OPS / 1e13)
    # The paper's 5.1510e13 is 3 x the rounded 1.7170e13; the exact 3x is 5.15094e13.
    assert TRAIN_STEP_FACTOR * ops == pytest.approx(PAPER_STEP_OPS, rel=2e-5)


def test_paper_preset_structure():
    arch = ModelConfig(preset="paper").architecture()
    assert (arch.growth_rate, arch.kernel_size, arch.levels) == (256, 5, 3)
    assert arch.layers_per_block == (1, 2, 4, 3, 4, 2, 1)
    assert arch.pool == "avg" and arch.dropout == 0.5 and arch.skip and arch.init_bias
    model = _meta_model(preset="paper")
    assert model.stem.bias is not None and model.head.bias is None
    assert model.head.kernel_size == (1, 1)
    assert all(tu.kernel_size == (1, 1) and tu.stride == (2, 2) for tu in model.transitions_up)


@pytest.mark.parametrize("preset", ["paper", "small", "tiny"])
def test_blocks_cover_every_parameter_once_in_forward_order(preset):
    model = _meta_model(preset=preset)
    blocks = model.blocks()
    ids = [id(p) for _, params in blocks for p in params]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    names = [name for name, _ in blocks]
    assert names[0] == "stem" and names[-1] == "head"
    assert names.index("down0") < names.index("bottleneck") < names.index("up0")


@pytest.mark.parametrize("targets", [["potential"], ["density"], ["potential", "density"]])
def test_tiny_forward_shapes_follow_targets(targets):
    torch.manual_seed(0)
    model = build_model(ModelConfig(preset="tiny", targets=targets))
    y = model(torch.randn(2, 64, 16, 16))
    assert y.shape == (2, len(targets), 16, 16)
    y.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("overrides", [
    dict(skip=False), dict(pool="max"), dict(td_bn=False), dict(dense_bn=True), dict(tu_kernel=3),
    dict(tu_kernel=2), dict(levels=1, layers_per_block=[1, 1, 1]), dict(td_channels=[8, 12]),
    dict(head_input="new"), dict(dropout=0.3, kernel_size=5), dict(levels=0, layers_per_block=[2]),
])
def test_configurable_variants_build_and_run(overrides):
    model = build_model(ModelConfig(preset="tiny", in_channels=4, **overrides))
    assert model(torch.randn(1, 4, 16, 16)).shape == (1, 1, 16, 16)


def test_overrides_change_counts():
    base = count_parameters(_meta_model(preset="tiny"))
    assert count_parameters(_meta_model(preset="tiny", growth_rate=16)) > base
    assert count_parameters(_meta_model(preset="tiny", skip=False)) < base
    assert count_parameters(_meta_model(preset="tiny", bn_affine=False)) < base


@pytest.mark.parametrize("overrides, fragment", [
    (dict(layers_per_block=[1, 2, 3]), "layers_per_block"),
    (dict(kernel_size=4), "kernel_size"),
    (dict(td_channels=[4]), "td_channels"),
])
def test_inconsistent_config_is_a_user_error(overrides, fragment):
    with pytest.raises(ModelConfigError, match=fragment):
        ModelConfig(preset="tiny", **overrides).architecture()


def test_wrong_input_shape_names_the_fix():
    model = build_model(ModelConfig(preset="tiny"))
    with pytest.raises(ModelConfigError, match="in_channels"):
        model(torch.randn(1, 32, 16, 16))
    with pytest.raises(ModelConfigError, match="multiple of 4"):
        model(torch.randn(1, 64, 18, 18))


@pytest.mark.parametrize("preset, shape", [("paper", (1024, 256, 256)), ("small", (1024, 64, 64)), ("tiny", (64, 16, 16))])
def test_analytic_flops_match_hooked_forward(preset, shape):
    from models.flops import fcdensenet_conv_ops

    model = _meta_model(preset=preset)
    assert fcdensenet_conv_ops(model, shape) == forward_conv_ops(model, shape)


def test_analytic_flops_of_a_variant():
    from models.flops import fcdensenet_conv_ops

    model = _meta_model(preset="tiny", tu_kernel=3, td_channels=[8, 12], head_input="new", skip=False)
    assert fcdensenet_conv_ops(model, (64, 32, 32)) == forward_conv_ops(model, (64, 32, 32))


def test_activation_checkpointing_leaves_outputs_and_gradients_unchanged():
    model = build_model(ModelConfig(preset="tiny", in_channels=4, dropout=0.3))
    x = torch.randn(2, 4, 16, 16)
    grads = []
    for enabled in (False, True):
        model.set_activation_checkpointing(enabled)
        model.zero_grad()
        torch.manual_seed(7)  # same dropout masks in both passes
        out = model(x)
        out.square().mean().backward()
        grads.append((out.detach(), [p.grad.clone() for p in model.parameters()]))
    (out_a, g_a), (out_b, g_b) = grads
    assert torch.equal(out_a, out_b)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(g_a, g_b))


@pytest.mark.slow
def test_paper_preset_trains_with_larc_adam_on_a_small_field():
    """The 220M-parameter model takes real LARC-Adam steps (8 x 8 px keeps it to seconds on a CPU)."""
    from models import TrainConfig
    from models.losses import huber_loss, l2_penalty
    from models.optim import BlockOptimizer

    torch.manual_seed(0)
    model = build_model(ModelConfig(preset="paper", dropout=0.0))
    opt = BlockOptimizer(model.blocks(), TrainConfig(optimizer="larc_adam"))
    x, y = torch.randn(1, 1024, 8, 8), torch.randn(1, 1, 8, 8)
    losses = []
    for _ in range(4):
        loss = huber_loss(model(x), y, 10.0) + l2_penalty(model.parameters(), 1e-4)
        opt.zero_grad()
        loss.backward()
        ratios = opt.step(1e-4)
        losses.append(float(loss.detach()))
    assert len(ratios) == len(model.blocks()) == 15
    assert losses[-1] < losses[0]
