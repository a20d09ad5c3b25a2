"""models.evaluation: metrics against projected targets, the mean and iCoM baselines, figures,
``report.html`` and the data-scaling study (docs/evaluation.md)."""
from __future__ import annotations

from .config import EvaluationConfig
from .evaluate import EvalResult, EvaluationInputError, evaluate
from .scaling import scaling_study

__all__ = ["EvaluationConfig", "EvalResult", "EvaluationInputError", "evaluate", "scaling_study"]
