"""The network presets `models.config.ModelConfig` resolves (``model.preset``): each a full set of
`Architecture` fields, which a config's per-field overrides then change."""
from __future__ import annotations

from typing import Any

#: Presets. ``paper``: Laanait et al. 2019 (FACTS.md), 220,399,104 parameters. ``small``: the same
#: design at k = 32 with 3x3 kernels (3,045,088 parameters), a model one GPU trains in hours.
#: ``tiny``: a few thousand parameters for CPU tests on 8 x 8 scans of 16 px patterns.
PRESETS: dict[str, dict[str, Any]] = {
    "paper": dict(in_channels=1024, init_channels=256, init_bias=True, growth_rate=256, kernel_size=5,
                  levels=3, layers_per_block=(1, 2, 4, 3, 4, 2, 1), td_channels=None, skip=True,
                  dense_bn=False, td_bn=True, bn_affine=False, pool="avg", tu_kernel=1, tu_stride=2,
                  dropout=0.5, head_input="all"),
    "small": dict(in_channels=1024, init_channels=64, init_bias=True, growth_rate=32, kernel_size=3,
                  levels=3, layers_per_block=(2, 3, 4, 5, 4, 3, 2), td_channels=None, skip=True,
                  dense_bn=False, td_bn=True, bn_affine=True, pool="avg", tu_kernel=1, tu_stride=2,
                  dropout=0.1, head_input="all"),
    "tiny": dict(in_channels=64, init_channels=16, init_bias=True, growth_rate=8, kernel_size=3,
                 levels=2, layers_per_block=(1, 2, 2, 2, 1), td_channels=None, skip=True,
                 dense_bn=False, td_bn=True, bn_affine=True, pool="avg", tu_kernel=1, tu_stride=2,
                 dropout=0.0, head_input="all"),
    # The scan-space layout (see Architecture.input_layout): 16 x 16 binned patterns as channels
    # over a 32 x 32 scan, a 1 x 1 stem (a learned reduction of each pattern), two pooling levels,
    # circular padding (the scan covers one period of the specimen);
    # 0.17 M parameters, 0.13 GFLOP forward per sample: a model a CPU trains on
    # thousands of samples in an hour (the study and the quickstart: docs/evaluation.md).
    "scan": dict(in_channels=1024, init_channels=32, init_bias=True, growth_rate=12, kernel_size=3,
                 levels=2, layers_per_block=(2, 3, 4, 3, 2), td_channels=None, skip=True,
                 dense_bn=False, td_bn=True, bn_affine=True, pool="avg", tu_kernel=1, tu_stride=2,
                 dropout=0.0, head_input="all", input_layout="scan", pattern_bins=16, stem_kernel=1,
                 padding_mode="circular"),
}
