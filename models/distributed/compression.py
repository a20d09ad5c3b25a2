"""Gradient compression: fp16/bf16 casting and 8-bit codes after Dettmers (2016).

Dettmers, "8-Bit Approximations for Parallelism in Deep Learning", ICLR 2016: values are scaled by
the maximum magnitude of their chunk into [-1, 1] and coded in 8 bits, either linearly (int8,
127 levels each side) or with the *dynamic tree* code (a sign bit, then an exponent written as a
run of zero bits ended by a 1, then the remaining bits as a linear fraction in [0.1, 1]), which
keeps relative precision for small values. Error feedback (Seide et al. 2014; Karimireddy et al.
2019) adds the quantisation error of one step to the next step's gradient so it is not lost.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch


@lru_cache(maxsize=1)
def dynamic_tree_codebook() -> torch.Tensor:
    """The 256 values of the signed 8-bit dynamic tree code, sorted ascending (float32, in [-1, 1]).

    For exponent e = 0..6 (e leading zero bits after the sign), 6 - e bits remain for the fraction:
    2**(6-e) linear bins between 0.1 and 1, represented by their midpoints, scaled by 10**-e.
    That gives 127 magnitudes; with both signs, zero and +1.0 it is 256 codes.
    """
    magnitudes: list[float] = []
    for exponent in range(7):
        edges = torch.linspace(0.1, 1.0, 2 ** (6 - exponent) + 1, dtype=torch.float64)
        mids = (edges[:-1] + edges[1:]) / 2
        magnitudes += (mids * 10.0 ** -exponent).tolist()
    values = sorted(set([0.0, 1.0] + magnitudes + [-m for m in magnitudes]))
    assert len(values) == 256, len(values)
    return torch.tensor(values, dtype=torch.float32)


@dataclass
class Quantized:
    """An 8-bit coded vector: ``codes`` (int8 for linear, uint8 indices for tree) + per-chunk scales."""

    codes: torch.Tensor
    scales: torch.Tensor
    numel: int

    @property
    def nbytes(self) -> int:
        return self.codes.numel() * self.codes.element_size() + self.scales.numel() * self.scales.element_size()


def _chunked(flat: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    pad = (-flat.numel()) % chunk
    rows = torch.nn.functional.pad(flat.float(), (0, pad)).view(-1, chunk)
    scales = rows.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny)
    return rows / scales[:, None], scales


def quantize(flat: torch.Tensor, code: str, chunk: int) -> Quantized:
    """Code a 1-D float tensor with ``code`` in {'int8_linear', 'int8_tree'} and max-scaled chunks."""
    unit, scales = _chunked(flat, chunk)
    if code == "int8_linear":
        codes = torch.round(unit * 127).to(torch.int8)
    elif code == "int8_tree":
        book = dynamic_tree_codebook().to(flat.device)
        # Nearest codebook value: search among midpoints between neighbouring codes.
        codes = torch.bucketize(unit.contiguous(), (book[1:] + book[:-1]) / 2).to(torch.uint8)
    else:
        raise ValueError(f"unknown 8-bit code {code!r}")
    # The padding of the last chunk is not sent: the receiver knows the length.
    return Quantized(codes.reshape(-1)[: flat.numel()], scales, flat.numel())


def dequantize(q: Quantized, code: str, chunk: int) -> torch.Tensor:
    """Inverse of :func:`quantize` (float32, length ``q.numel``)."""
    if code == "int8_linear":
        unit = q.codes.float() / 127
    else:
        unit = dynamic_tree_codebook().to(q.codes.device)[q.codes.long()]
    unit = torch.nn.functional.pad(unit, (0, (-q.numel) % chunk))
    return (unit.view(-1, chunk) * q.scales[:, None]).reshape(-1)[: q.numel]


class ErrorFeedback:
    """Per-key residuals: ``x + residual`` is coded, and what the code lost becomes the new residual."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._residual: dict[object, torch.Tensor] = {}

    def quantize(self, key: object, flat: torch.Tensor, code: str, chunk: int) -> Quantized:
        if self.enabled and key in self._residual and self._residual[key].numel() == flat.numel():
            flat = flat + self._residual[key]
        q = quantize(flat, code, chunk)
        if self.enabled:
            self._residual[key] = flat - dequantize(q, code, chunk)
        return q
