"""FLOP accounting after Laanait, Romero et al. (2019), eq. 1-3.

Eq. 1: a convolution costs OPS = 2 * H * W * C * K * R * S (H x W output positions, C input and K
output channels, R x S kernel; the 2 counts the multiply and the add). A transposed convolution
scatters every *input* position through its kernel, so it costs 2 * H_in * W_in * C * K * R * S.
Eq. 2: a training step costs 3x the forward ops (forward, gradient w.r.t. activations and
w.r.t. weights). Eq. 3: sustained FLOP/s = ops per step / step time, per device.

Counts come from forward hooks over a forward pass on the meta device, so the paper's model at
1024 x 512 x 512 is counted in milliseconds without allocating memory.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

#: eq. 2: a training step is counted as 3 forward passes (as the paper does).
TRAIN_STEP_FACTOR = 3


def conv_ops(module: nn.Module, inp: torch.Tensor, out: torch.Tensor) -> int:
    """Eq. 1 for one call of a Conv2d / ConvTranspose2d (whole batch)."""
    r, s = module.kernel_size
    c_in, c_out, groups = module.in_channels, module.out_channels, module.groups
    batch = out.shape[0]
    h, w = (inp.shape[-2:] if isinstance(module, nn.ConvTranspose2d) else out.shape[-2:])
    return 2 * batch * int(h) * int(w) * (c_in // groups) * c_out * r * s


def forward_conv_ops(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Forward conv ops per sample for inputs of ``input_shape`` = (S, P, P) (or (1, S, P, P)).

    Runs a forward pass of a meta-device copy of the model, so the model itself is untouched.
    """
    shape = tuple(input_shape)
    if len(shape) == 3:
        shape = (1, *shape)
    meta = _meta_copy(model)
    total = 0

    def hook(module: nn.Module, args: tuple, out: torch.Tensor) -> None:
        nonlocal total
        total += conv_ops(module, args[0], out)

    handles = [m.register_forward_hook(hook) for m in meta.modules()
               if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d))]
    try:
        with torch.no_grad():
            meta.eval()(torch.empty(shape, device="meta"))
    finally:
        for h in handles:
            h.remove()
    return total // shape[0]


def fcdensenet_conv_ops(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Eq. 1 summed over an `FCDenseNet` analytically from its structure (no forward pass, so no
    meta-device machinery to import); `forward_conv_ops` gives the same number by hooks."""
    s = model.arch.tu_stride
    h, w = input_shape[-2:]
    levels = model.arch.levels

    def ops(conv: nn.Module, hh: int, ww: int) -> int:
        r, q = conv.kernel_size
        return 2 * hh * ww * conv.in_channels * conv.out_channels * r * q // conv.groups

    def convs(module: nn.Module) -> list[nn.Module]:
        return [m for m in module.modules() if isinstance(m, nn.Conv2d)]

    total = ops(model.stem, h, w) + ops(model.head, h, w)
    for i, (block, td) in enumerate(zip(model.down_blocks, model.transitions_down)):
        total += sum(ops(c, h // s ** i, w // s ** i) for c in convs(block) + convs(td))
    total += sum(ops(c, h // s ** levels, w // s ** levels) for c in convs(model.bottleneck))
    for i, (tu, block) in enumerate(zip(model.transitions_up, model.up_blocks)):
        lvl = levels - i  # the transposed conv is counted at its input size
        total += ops(tu, h // s ** lvl, w // s ** lvl)
        total += sum(ops(c, h // s ** (lvl - 1), w // s ** (lvl - 1)) for c in convs(block))
    return total


def _meta_copy(model: nn.Module) -> nn.Module:
    """A structurally identical model on the meta device (no data copied)."""
    arch = getattr(model, "arch", None)
    if arch is not None:
        from .fcdensenet import FCDenseNet

        with torch.device("meta"):
            return FCDenseNet(arch)
    import copy

    return copy.deepcopy(model).to("meta")


@dataclass
class StepFlops:
    """Eq. 3 for one step on one device. Times in seconds, rates in TFLOP/s."""

    ops_per_step: float
    step_s: float
    compute_s: float
    comm_s: float
    other_s: float
    sustained_tflops: float
    compute_tflops: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def step_flops(ops_per_sample_forward: int, batch_per_device: int, step_s: float,
               comm_s: float = 0.0, compute_s: float | None = None) -> StepFlops:
    """Sustained TFLOP/s of one device (eq. 3) and the split of the step time.

    ``compute_s`` is forward + backward + optimiser (default: step time minus communication);
    ``comm_s`` is the engine's measured communication/wait time; the rest (data loading, logging)
    is ``other_s``. ``compute_tflops`` is the rate during compute alone (the "peak" the paper
    quotes next to the sustained rate).
    """
    ops = float(TRAIN_STEP_FACTOR * ops_per_sample_forward * batch_per_device)
    compute = max(step_s - comm_s, 0.0) if compute_s is None else compute_s
    other = max(step_s - compute - comm_s, 0.0)
    sustained = ops / step_s / 1e12 if step_s > 0 else 0.0
    peak = ops / compute / 1e12 if compute > 0 else 0.0
    return StepFlops(ops, step_s, compute, comm_s, other, sustained, peak)
