"""Confidence bounds on proportions and their difference. Pure.

* :func:`wilson`: the Wilson score interval of ``k`` successes in ``n`` trials (good at small
  ``n`` and at proportions near 0, where the normal approximation is not).
* :func:`diff_bounds`: Newcombe's hybrid score interval (method 10 of Newcombe 1998, "Interval
  estimation for the difference between independent proportions") for ``p1 − p2``, built from
  the two Wilson intervals.

``z`` is the standard normal quantile of the wanted level; for a one-sided bound at confidence
``c`` use :func:`z_one_sided` (``c = 0.95`` gives 1.645).
"""

from __future__ import annotations

import math
from statistics import NormalDist

__all__ = ["diff_bounds", "wilson", "z_one_sided"]


def z_one_sided(confidence: float) -> float:
    """The standard normal quantile at ``confidence`` (0.5 < confidence < 1)."""
    return NormalDist().inv_cdf(confidence)


def wilson(k: int, n: int, z: float) -> tuple[float, float]:
    """Wilson score bounds of the proportion ``k / n`` at quantile ``z``; (0, 1) when ``n`` is 0."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    z2 = z * z
    den = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)


def diff_bounds(k1: int, n1: int, k2: int, n2: int, z: float) -> tuple[float, float]:
    """Newcombe's bounds of ``k1/n1 − k2/n2`` at quantile ``z`` (each bound one-sided at ``z``)."""
    p1 = k1 / n1 if n1 else 0.0
    p2 = k2 / n2 if n2 else 0.0
    l1, u1 = wilson(k1, n1, z)
    l2, u2 = wilson(k2, n2, z)
    d = p1 - p2
    lo = d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    hi = d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    return max(-1.0, lo), min(1.0, hi)
