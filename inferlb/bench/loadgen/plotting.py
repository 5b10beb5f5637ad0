"""matplotlib for the ``--plot`` charts (the ``plot`` extra): one import, on the headless backend."""

from __future__ import annotations

from typing import Any

__all__ = ["pyplot"]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display needed); RuntimeError naming the
    ``plot`` extra when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError("--plot needs matplotlib: pip install 'inferlb[plot]'") from exc
    return plt
