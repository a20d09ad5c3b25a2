"""8-bit gradient codes after Dettmers (2016) and error feedback (no processes needed)."""
from __future__ import annotations

import pytest
import torch

from models.distributed.compression import ErrorFeedback, dequantize, dynamic_tree_codebook, quantize


def test_dynamic_tree_codebook_is_256_sorted_codes_in_unit_range():
    book = dynamic_tree_codebook()
    assert book.numel() == 256 and torch.all(book[1:] > book[:-1])
    assert book.min() >= -1 and book.max() == 1 and (book == 0).sum() == 1
    # Seven decades of dynamic range: the smallest non-zero magnitude is ~1e-7.
    assert 1e-8 < book.abs()[book != 0].min() < 1e-6


@pytest.mark.parametrize("code", ["int8_linear", "int8_tree"])
def test_roundtrip_error_is_bounded_per_chunk(code):
    torch.manual_seed(0)
    x = torch.randn(10_000) * torch.logspace(-4, 0, 10_000)
    chunk = 512
    q = quantize(x, code, chunk)
    assert q.codes.dtype in (torch.int8, torch.uint8) and q.codes.numel() == x.numel()
    assert q.nbytes == x.numel() + 4 * (-(-x.numel() // chunk))  # 1 byte/value + one fp32 scale/chunk
    y = dequantize(q, code, chunk)
    pad = (-x.numel()) % chunk
    scale = torch.nn.functional.pad(x.abs(), (0, pad)).view(-1, chunk).amax(1).repeat_interleave(chunk)[: x.numel()]
    err = (y - x).abs() / scale
    if code == "int8_linear":
        assert err.max() <= 0.5 / 127 + 1e-6  # half a step of 127 levels
    else:
        # The tree code's widest bin (exponent 0: 64 bins over [0.1, 1]) bounds the error near the max,
        # and it keeps relative precision for small values, unlike the linear code.
        assert err.max() <= 0.9 / 64 / 2 + 1e-6
        small = x.abs() < 0.01 * scale
        lin = (dequantize(quantize(x, "int8_linear", chunk), "int8_linear", chunk) - x).abs()
        assert (y - x).abs()[small].mean() < lin[small].mean()


def test_error_feedback_recovers_the_sum_of_many_steps():
    torch.manual_seed(1)
    # Gradients with a small steady component under large noise: what linear 8-bit codes lose.
    grads = [torch.randn(4096) * 1e-3 + 2e-6 for _ in range(50)]
    total = torch.stack(grads).sum(0)

    def rel_error(enabled: bool) -> float:
        fb = ErrorFeedback(enabled)
        sent = sum(dequantize(fb.quantize("g", g, "int8_linear", 4096), "int8_linear", 4096) for g in grads)
        return float((sent - total).norm() / total.norm())

    # With feedback the running sum is off by at most the last step's residual.
    assert rel_error(True) < 0.01
    assert rel_error(True) < rel_error(False) / 3
