"""Small figures every evaluation adapter computes: a mean with its standard error, a finite float.

A leaf module, so the adapters (``eval_rg``, ``eval_bfcl``, ``eval_tau2``) and ``evaluators``, which
imports them, all import it at the top without a cycle.
"""

from __future__ import annotations

import math
from typing import Any


def finite(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def mean_stderr(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and standard error of the mean (sample std / sqrt(n)); stderr None below 2 values."""
    if not values:
        return None, None
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, None
    var = sum((v - m) ** 2 for v in values) / (len(values) - 1)
    return m, math.sqrt(var / len(values))
