"""evaluation: judging a trained reconstructor: metrics against projected targets, the classical
baselines (mean, iCoM, ptychography), the verdict, figures and ``report.html`` (docs/evaluation.md)."""
from __future__ import annotations

from .config import EvaluationConfig
from .evaluate import EvalResult, EvaluationInputError, evaluate

__all__ = ["EvaluationConfig", "EvalResult", "EvaluationInputError", "evaluate"]
