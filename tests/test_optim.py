"""LARC/LARS and LAMB trust ratios against hand-computed cases, optimiser wiring, schedules, loss scaling."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from models import ModelConfig, TrainConfig, build_model
from models.amp import LossScaler, grads_finite
from models.losses import huber_loss, l2_penalty
from models.optim import BlockOptimizer, LambAdam, apply_larc_, larc_trust_ratios
from models.schedules import LRSchedule, huber_delta
from _train_helpers import one_thread  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")


def _param(values, grad):
    p = nn.Parameter(torch.tensor(values, dtype=torch.float32))
    p.grad = torch.tensor(grad, dtype=torch.float32)
    return p


def _hand_blocks():
    # block a: ||w|| = 5 (3-4-5 over two tensors), ||g|| = 1    -> eta * 5 / 1 = 0.1 with eta 0.02
    # block b: ||w|| = 1, ||g|| = 0.001                         -> 0.02 * 1 / 0.001 = 20
    # block c: zero gradient                                    -> 1 (no rescale)
    a = [_param([3.0], [0.6]), _param([4.0], [0.8])]
    b = [_param([1.0, 0.0], [0.0, 0.001])]
    c = [_param([2.0], [0.0])]
    return [("a", a), ("b", b), ("c", c)]


def test_larc_trust_ratios_hand_computed():
    assert larc_trust_ratios(_hand_blocks(), eta=0.02, mode="scale") == pytest.approx([0.1, 20.0, 1.0])
    assert larc_trust_ratios(_hand_blocks(), eta=0.02, mode="clip") == pytest.approx([0.1, 1.0, 1.0])


def test_apply_larc_scales_whole_blocks():
    blocks = _hand_blocks()
    apply_larc_(blocks, eta=0.02, mode="scale")
    (_, a), (_, b), _ = blocks
    assert [float(p.grad) for p in a] == pytest.approx([0.06, 0.08])
    assert b[0].grad.tolist() == pytest.approx([0.0, 0.02])


def test_lamb_step_hand_computed():
    # first Adam step: m_hat = g, v_hat = g^2, so u = g / (|g| + eps) = sign(g) (to 1e-8)
    w = nn.Parameter(torch.tensor([3.0, 4.0]))
    w.grad = torch.tensor([0.5, -2.0])
    opt = LambAdam([{"params": [w]}], lr=0.1, eps=1e-12)
    opt.step()
    ratio = 5.0 / math.sqrt(2.0)  # ||w|| / ||u||
    assert [float(r) for r in opt.last_ratios] == pytest.approx([ratio])
    assert w.detach().tolist() == pytest.approx([3.0 - 0.1 * ratio, 4.0 + 0.1 * ratio], rel=1e-6)


def test_block_optimizer_groups_are_the_model_blocks_and_larc_precedes_adam():
    torch.manual_seed(0)
    model = build_model(ModelConfig(preset="tiny", in_channels=4))
    twin = build_model(ModelConfig(preset="tiny", in_channels=4))
    twin.load_state_dict(model.state_dict())
    x = torch.randn(2, 4, 16, 16)
    for m in (model, twin):
        m(x).pow(2).mean().backward()
    cfg = TrainConfig(optimizer="larc_adam", larc_mode="clip", trust_coefficient=0.001)
    opt = BlockOptimizer(model.blocks(), cfg)
    assert [g["name"] for g in opt.torch_optimizer.param_groups] == [n for n, _ in model.blocks()]
    ratios = opt.step(lr=1e-3)
    # the same by hand: LARC factors on the gradients, then torch's Adam
    expected = apply_larc_(twin.blocks(), 0.001, "clip")
    torch.optim.Adam(twin.parameters(), lr=1e-3).step()
    assert ratios == pytest.approx(expected)
    assert any(r < 1 for r in ratios)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters()))


def test_adamw_decouples_weight_decay():
    assert not BlockOptimizer([("x", [nn.Parameter(torch.ones(2))])], TrainConfig(optimizer="adamw")).l2_in_loss
    assert BlockOptimizer([("x", [nn.Parameter(torch.ones(2))])], TrainConfig(optimizer="larc_adam")).l2_in_loss


@pytest.mark.parametrize("step, expected", [
    (0, 1e-4), (5, 1e-4 + (4e-4 - 1e-4) * 5 / 10), (10, 4e-4), (29, 4e-4), (30, 2e-4), (49, 2e-4), (50, 1e-4),
])
def test_lr_warmup_to_n_times_lr0_then_staircase(step, expected):
    sched = LRSchedule(lr0=1e-4, world_size=4, warmup_steps=10, decay_every=20, decay_factor=0.5)
    assert sched(step) == pytest.approx(expected)


def test_lr_peak_is_capped_at_one():
    assert LRSchedule(lr0=0.1, world_size=64, warmup_steps=4)(4) == 1.0
    assert LRSchedule(lr0=1e-4)(1000) == 1e-4  # one worker, no decay: constant


@pytest.mark.parametrize("epoch, expected", [(0, 10.0), (1, 9.9), (10, 10 * 0.99 ** 10), (100, 10 * 0.99 ** 100)])
def test_huber_delta_decays_per_epoch(epoch, expected):
    assert huber_delta(epoch, 10.0, 0.99) == pytest.approx(expected)


def test_huber_and_l2_terms():
    pred, target = torch.tensor([0.0, 0.0]), torch.tensor([0.5, 3.0])
    # 0.5 * 0.5^2 inside delta = 1; 1 * (3 - 0.5) outside
    assert float(huber_loss(pred, target, 1.0)) == pytest.approx((0.125 + 2.5) / 2)
    assert float(l2_penalty([torch.tensor([3.0, 4.0])], 1e-4)) == pytest.approx(0.5 * 1e-4 * 25)


def test_loss_scaler_backoff_skip_floor_and_growth():
    s = LossScaler(True, init_scale=8.0, floor=2.0, growth_interval=3)
    assert s.update(False) is False and s.scale == 4.0 and s.overflow_steps == 1
    assert s.update(False) is False and s.scale == 2.0
    assert s.update(False) is False and s.scale == 2.0 and s.at_floor  # never below the floor
    assert [s.update(True) for _ in range(3)] == [True] * 3 and s.scale == 4.0  # x2 after 3 clean steps
    restored = LossScaler(True, floor=2.0)  # the floor comes from the config, the rest from the state
    restored.load_state_dict(s.state_dict())
    assert restored.state_dict() == s.state_dict()


def test_unscale_and_finite_check():
    p = _param([1.0], [8.0])
    s = LossScaler(True, init_scale=4.0)
    s.unscale_([p])
    assert float(p.grad) == 2.0 and grads_finite([p])
    p.grad = torch.tensor([float("inf")])
    assert not grads_finite([p])
