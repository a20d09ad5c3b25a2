"""FC-DenseNet ("Tiramisu", Jegou et al. 2017) as used by Laanait, Romero et al. (2019).

Maps a stack of S diffraction patterns, (B, S, P, P), to C target maps, axes [batch, channel,
row = y, col = x]: (B, C, P, P) in the paper's ``patterns`` input layout, where the S patterns are
the channels; (B, C, scan_y, scan_x) in the ``scan`` layout, where the patterns are binned to
b x b pixels and rearranged to (B, b^2, scan_y, scan_x) first (`ScanSpaceInput`). Layout (all
sizes from `Architecture`):

    [scan layout: bin patterns, probe positions -> spatial axes]
    initial conv (stem_kernel or R, bias)                   -> init_channels
    encoder level i:  dense block (n_i layers) -> skip_i -> transition down (/ tu_stride)
    bottleneck:       dense block; only its new features go up
    decoder level i:  transition up (transposed conv, x tu_stride) on the previous block's new
                      features -> concat skip_i -> dense block
    head:             1x1 conv, no bias, no activation       -> C

Dense layer = [BN] -> ReLU -> conv R x R (no bias) -> dropout; its k new maps are concatenated
onto its input. Transition down = [BN] -> ReLU -> 1x1 conv (no bias) -> dropout -> pool.

Every spatial conv pads with ``arch.padding_mode``: zeros, or circular (the scan layout's default:
its image axes are the probe positions over one period of the specimen, so the neighbour of the
last position is the first). `edge_reach` is how far into the map that padding is seen.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .config import Architecture, ModelConfig, ModelConfigError


class DenseLayer(nn.Sequential):
    """[BN] -> ReLU -> conv (no bias) -> dropout: adds ``growth_rate`` feature maps.

    ``relu_inplace`` is safe only when the layer's input is a fresh tensor nobody else reads (a
    concatenation made for this layer, or the BN output), which saves one activation per layer.
    """

    def __init__(self, in_channels: int, arch: Architecture, relu_inplace: bool):
        layers: list[nn.Module] = [nn.BatchNorm2d(in_channels, affine=arch.bn_affine)] if arch.dense_bn else []
        layers += [nn.ReLU(inplace=relu_inplace or arch.dense_bn),
                   same_conv(in_channels, arch.growth_rate, arch.kernel_size, arch.padding_mode, bias=False)]
        if arch.dropout > 0:
            layers.append(nn.Dropout(arch.dropout))
        super().__init__(*layers)


def same_conv(in_channels: int, out_channels: int, kernel: int, padding_mode: str, bias: bool) -> nn.Conv2d:
    """A conv of odd ``kernel`` that keeps the size, padding with ``padding_mode`` (a 1 x 1 conv pads
    nothing, so it takes torch's plain path)."""
    return nn.Conv2d(in_channels, out_channels, kernel, padding=kernel // 2, bias=bias,
                     padding_mode=padding_mode if kernel > 1 else "zeros")


class DenseBlock(nn.Module):
    """``n_layers`` dense layers; returns (input ++ new features, new features)."""

    def __init__(self, in_channels: int, n_layers: int, arch: Architecture):
        super().__init__()
        # The first layer reads the block input itself (still needed for the concatenation).
        self.layers = nn.ModuleList(DenseLayer(in_channels + i * arch.growth_rate, arch, relu_inplace=i > 0)
                                    for i in range(n_layers))
        self.out_channels = in_channels + n_layers * arch.growth_rate
        self.new_channels = n_layers * arch.growth_rate
        self.activation_checkpointing = False

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        new: list[Tensor] = []
        recompute = self.activation_checkpointing and torch.is_grad_enabled()
        for layer in self.layers:
            if recompute:
                # Keep only the layer's new maps; the concatenated input (the quadratic memory of a
                # DenseNet, Pleiss et al. 2017) is rebuilt in the backward pass. Dropout masks are
                # replayed from the saved RNG state, so the gradients are unchanged.
                new.append(checkpoint(_concat_then, layer, x, *new, use_reentrant=False))
            else:
                new.append(_concat_then(layer, x, *new))
        new_features = torch_cat(new)
        return torch_cat([x, new_features]), new_features


def _concat_then(layer: nn.Module, *inputs: Tensor) -> Tensor:
    return layer(torch_cat(list(inputs)))


def torch_cat(tensors: list[Tensor]) -> Tensor:
    """Concatenate along channels; a single tensor is returned as is."""
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=1)


class TransitionDown(nn.Sequential):
    """[BN] -> ReLU -> 1x1 conv (no bias) -> dropout -> pool (factor tu_stride)."""

    def __init__(self, in_channels: int, out_channels: int, arch: Architecture):
        layers: list[nn.Module] = [nn.BatchNorm2d(in_channels, affine=arch.bn_affine)] if arch.td_bn else []
        layers += [nn.ReLU(inplace=arch.td_bn), nn.Conv2d(in_channels, out_channels, 1, bias=False)]
        if arch.dropout > 0:
            layers.append(nn.Dropout(arch.dropout))
        pool = nn.AvgPool2d if arch.pool == "avg" else nn.MaxPool2d
        layers.append(pool(arch.tu_stride))
        super().__init__(*layers)


class TransitionUp(nn.ConvTranspose2d):
    """Transposed conv (no bias) that multiplies the size by exactly ``tu_stride``.

    With tu_kernel > tu_stride an input pixel's kernel footprint crosses the output's edge; torch's
    transposed conv drops that part (zeros padding only), so with circular padding the full
    output is computed and the overhang is added back at the opposite edge (`_fold`).
    """

    def __init__(self, channels: int, arch: Architecture):
        k, s = arch.tu_kernel, arch.tu_stride
        padding = _tu_padding(k, s)
        output_padding = s - k + 2 * padding  # out = (H - 1) s - 2 p + k + op = s H
        super().__init__(channels, channels, k, stride=s, padding=padding, output_padding=output_padding,
                         bias=False)
        self.circular = arch.padding_mode == "circular" and k > s

    def forward(self, x: Tensor, output_size: list[int] | None = None) -> Tensor:
        if not self.circular:
            return super().forward(x, output_size)
        full = nn.functional.conv_transpose2d(x, self.weight, stride=self.stride)  # (H - 1) s + k per axis
        p, s = self.padding[0], self.stride[0]
        return _fold(_fold(full, 2, s * x.shape[2], p), 3, s * x.shape[3], p)


def _tu_padding(kernel: int, stride: int) -> int:
    """The transposed conv's padding: half the kernel's excess over the stride, rounded up."""
    return max(0, -(-(kernel - stride) // 2))


def _fold(full: Tensor, dim: int, size: int, offset: int) -> Tensor:
    """Periodic sum along ``dim``: element f of ``full`` lands at (f - offset) mod ``size``."""
    extra = -full.shape[dim] % size
    pad = [0, 0] * (full.ndim - 1 - dim) + [0, extra]
    folded = nn.functional.pad(full, pad).unflatten(dim, (-1, size)).sum(dim)
    return folded.roll(-offset, dims=dim)


class ScanSpaceInput(nn.Module):
    """(B, S, P, P) stacks -> (B, b^2, scan_y, scan_x): each pattern averaged over (P/b) x (P/b)
    pixel bins, its b^2 bins become channels at its probe position; the last ``physics_planes`` planes
    of the input (physics maps, `stage.physics_inputs`) are resampled to the scan grid and appended. Patterns are in scan order,
    row-major (index s = i * scan_x + j at scan row i, column j; `namsa.optics.scan_positions`),
    and bins keep the pattern's (ky, kx) order in the channel index (c = u * b + v)."""

    def __init__(self, scan_shape: tuple[int, int], bins: int, physics_planes: int = 0):
        super().__init__()
        self.scan_shape, self.bins, self.physics_planes = tuple(scan_shape), bins, physics_planes

    def forward(self, x: Tensor) -> Tensor:
        k = self.physics_planes
        binned = self._bin(x[:, :-k] if k else x)
        if not k:
            return binned
        # The last k planes are maps on the targets' (P, P) grid: area-resampled to the scan grid
        # (identity when P equals the scan size) and appended as channels.
        maps = x[:, -k:]
        if tuple(maps.shape[-2:]) != self.scan_shape:
            maps = nn.functional.interpolate(maps, size=self.scan_shape, mode="area")
        return torch.cat([binned, maps.to(binned.dtype)], dim=1)

    def _bin(self, x: Tensor) -> Tensor:
        b, s, p, _ = x.shape
        binned = nn.functional.avg_pool2d(x.reshape(b * s, 1, p, p), p // self.bins)
        return binned.reshape(b, *self.scan_shape, self.bins ** 2).permute(0, 3, 1, 2).contiguous()


class ICoMResidual(nn.Module):
    """The potential as a correction of the classical answer (``Architecture.icom_residual``):
    ``out[:, c] = head[:, c] + (1 + gate) * gain * icom``, with ``icom`` the standardised iCoM input
    plane (on the output grid) and ``gate`` the head's extra map. ``gain`` converts the plane's
    standardisation to the target's; `init_gain` starts it at the physical ratio, so an untrained
    network already returns iCoM's contrast, and the gate can turn it off where iCoM fails
    (channelling, shot noise)."""

    def __init__(self, channel: int, plane: int):
        super().__init__()
        self.channel, self.plane = channel, plane
        self.gain = nn.Parameter(torch.ones(()))

    def init_gain(self, icom_std: float, target_std: float) -> None:
        """Start ``gain`` at ``icom_std / target_std`` (V*Angstrom per standardised unit, each)."""
        with torch.no_grad():
            self.gain.fill_(float(icom_std) / float(target_std))

    def forward(self, head: Tensor, x: Tensor) -> Tensor:
        out, gate = head[:, :-1], head[:, -1:]
        icom = x[:, self.plane:self.plane + 1].to(out.dtype)
        if icom.shape[-2:] != out.shape[-2:]:
            icom = nn.functional.interpolate(icom, size=tuple(out.shape[-2:]), mode="area")
        add = (1.0 + gate) * self.gain * icom
        c = self.channel
        return torch.cat([out[:, :c], out[:, c:c + 1] + add, out[:, c + 1:]], dim=1)


class FCDenseNet(nn.Module):
    """The reconstructor network; ``arch`` fixes every size (see `models.config.Architecture`)."""

    def __init__(self, arch: Architecture):
        super().__init__()
        self.arch = arch
        k = arch.kernel_size
        self.layout = (ScanSpaceInput(arch.scan_shape, arch.pattern_bins, len(arch.physics_inputs))
                       if arch.input_layout == "scan" else None)
        self.stem = same_conv(arch.stem_channels, arch.init_channels, arch.stem_kernel or k, arch.padding_mode,
                              bias=arch.init_bias)
        enc_layers = arch.layers_per_block[:arch.levels]
        dec_layers = arch.layers_per_block[arch.levels + 1:]
        self.down_blocks, self.transitions_down = nn.ModuleList(), nn.ModuleList()
        skips: list[int] = []
        width = arch.init_channels
        for level, n_layers in enumerate(enc_layers):
            block = DenseBlock(width, n_layers, arch)
            self.down_blocks.append(block)
            skips.append(block.out_channels if arch.skip else 0)
            td_out = block.out_channels if arch.td_channels is None else arch.td_channels[level]
            self.transitions_down.append(TransitionDown(block.out_channels, td_out, arch))
            width = td_out
        self.bottleneck = DenseBlock(width, arch.layers_per_block[arch.levels], arch)
        new = self.bottleneck.new_channels if arch.levels else self.bottleneck.out_channels
        self.transitions_up, self.up_blocks = nn.ModuleList(), nn.ModuleList()
        block = self.bottleneck
        for level, n_layers in enumerate(dec_layers):
            self.transitions_up.append(TransitionUp(new, arch))
            block = DenseBlock(new + skips[-1 - level], n_layers, arch)
            self.up_blocks.append(block)
            new = block.new_channels
        head_in = block.out_channels if arch.head_input == "all" else block.new_channels
        self.head = nn.Conv2d(head_in, arch.head_channels, 1, bias=False)
        # the iCoM plane's index in the input stack: after the S patterns, in physics_inputs order
        self.icom_residual = (ICoMResidual(arch.icom_residual, arch.in_channels + arch.physics_inputs.index("icom"))
                              if arch.icom_residual >= 0 else None)

    def forward(self, x: Tensor) -> Tensor:
        self._check_input(x)
        y = self._features(x)
        return y if self.icom_residual is None else self.icom_residual(y, x)

    def _features(self, x: Tensor) -> Tensor:
        """The head's maps: one per target (plus the iCoM gate with ``icom_residual``)."""
        x = self.stem(x if self.layout is None else self.layout(x))
        skips: list[Tensor] = []
        for block, td in zip(self.down_blocks, self.transitions_down):
            x, _ = block(x)
            skips.append(x)
            x = td(x)
        x, new = self.bottleneck(x)
        for level, (tu, block) in enumerate(zip(self.transitions_up, self.up_blocks)):
            up = tu(new)
            x, new = block(torch_cat([up, skips[-1 - level]]) if self.arch.skip else up)
        return self.head(x if self.arch.head_input == "all" else new)

    def _check_input(self, x: Tensor) -> None:
        arch = self.arch
        if x.ndim != 4 or x.shape[1] != arch.input_planes or x.shape[-1] != x.shape[-2]:
            extra = f" + {len(arch.physics_inputs)} physics maps {list(arch.physics_inputs)}" if arch.physics_inputs else ""
            raise ModelConfigError(
                f"model input must be (B, S={arch.in_channels}{extra}, P, P) diffraction stacks, got {tuple(x.shape)}; "
                f"set model.in_channels to the data's patterns per sample (scan_y * scan_x)")
        problem = arch.data_mismatch(arch.in_channels, x.shape[-1], target_px=None)
        if problem:
            raise ModelConfigError(str(problem))

    def set_activation_checkpointing(self, enabled: bool) -> None:
        """Recompute dense-layer inputs in the backward pass instead of storing them (less memory,
        about one extra forward of compute); the results are unchanged."""
        for module in self.modules():
            if isinstance(module, DenseBlock):
                module.activation_checkpointing = bool(enabled)

    def blocks(self) -> list[tuple[str, list[nn.Parameter]]]:
        """Network blocks in forward order with their parameters (every parameter exactly once).

        One entry per stem, dense block, transition down/up and head: the unit of LARC trust
        ratios (Laanait et al. 2019) and of the per-block gradient groups of models.distributed.
        """
        named: list[tuple[str, nn.Module]] = [("stem", self.stem)]
        for i, (block, td) in enumerate(zip(self.down_blocks, self.transitions_down)):
            named += [(f"down{i}", block), (f"td{i}", td)]
        named.append(("bottleneck", self.bottleneck))
        for i, (tu, block) in enumerate(zip(self.transitions_up, self.up_blocks)):
            named += [(f"tu{i}", tu), (f"up{i}", block)]
        named.append(("head", self.head))
        if self.icom_residual is not None:
            named.append(("icom_residual", self.icom_residual))
        out = [(name, [p for p in module.parameters()]) for name, module in named]
        return [(name, params) for name, params in out if params]


def edge_reach(arch: Architecture) -> int:
    """How far the padding reaches into the output map, in output pixels (scan positions in the scan
    layout): the receptive-field half-width of an output pixel, the largest over the tu_stride^levels
    alignments of a pixel to the pooling grid. Pixels at least this far from every edge (index >=
    reach and <= size - 1 - reach along each axis) see no padding: they do not depend on the
    padding mode, nor on what lies beyond the input's edge."""
    stem = (arch.stem_kernel or arch.kernel_size) // 2
    reach = 0
    for x in range(arch.size_multiple):
        lo, hi = _span_into_block(arch, arch.levels, x, x, head=True)
        reach = max(reach, x - lo + stem, hi + stem - x)
    return reach


def _span_into_block(arch: Architecture, level: int, lo: int, hi: int, head: bool = False) -> tuple[int, int]:
    """The span of encoder block ``level``'s input (the stem's output at level 0, in level-``level``
    pixels) that the pixels [lo, hi] of the decoder's concatenated input at ``level`` depend on (of
    the bottleneck's input at ``level`` = levels: the same tensor). ``head``: [lo, hi] are output
    pixels instead (the head's 1 x 1 conv reads the last block)."""
    r, s, levels = arch.kernel_size // 2, arch.tu_stride, arch.levels
    if head:  # output pixels -> the last block's input at level 0 (the bottleneck when levels = 0)
        n = arch.layers_per_block[-1]
        lo, hi, level = lo - n * r, hi + n * r, 0
    if level == levels:
        return lo, hi
    k, p = arch.tu_kernel, _tu_padding(arch.tu_kernel, s)
    # transposed conv: output j = s i - p + m (0 <= m < k) reads input i; then the block below it
    n_below = arch.layers_per_block[levels + (levels - 1 - level)]
    ulo, uhi = -(-(lo + p - k + 1) // s) - n_below * r, (hi + p) // s + n_below * r
    ulo, uhi = _span_into_block(arch, level + 1, ulo, uhi)
    plo, phi = ulo * s, uhi * s + s - 1  # the pool of the transition down at this level
    if arch.skip:
        plo, phi = min(plo, lo), max(phi, hi)
    n_enc = arch.layers_per_block[level]
    return plo - n_enc * r, phi + n_enc * r


def build_model(cfg: ModelConfig | Architecture | None = None) -> FCDenseNet:
    """An FC-DenseNet from a `ModelConfig` (preset + overrides) or a resolved `Architecture`."""
    arch = cfg if isinstance(cfg, Architecture) else (cfg or ModelConfig()).architecture()
    return FCDenseNet(arch)


def count_parameters(model: nn.Module) -> int:
    """Number of learnable scalars (batch-norm running statistics are buffers, not counted)."""
    return sum(p.numel() for p in model.parameters())
