"""A latency predictor's learned state as JSON, and back: what survives a gateway restart.

:func:`state_of` turns the built-in :class:`~.predictor.OnlineLinear` into a JSON-able mapping
(format tag, feature names, params, version, observations learned, the weighted sums D and e of
both regressions, and the weights w themselves, so a restored model predicts bit for bit what the
saved one did). :func:`restore` checks a saved mapping against what this gateway would build
(``routing.predictor``) and rebuilds the model, or raises :class:`IncompatibleState` saying why:
another format or predictor type, other features (a newer gateway), other params (the operator
changed them: a model fitted under the old ones is not what was asked for), wrong shapes, or a
value that is not finite. The caller ignores such a state, records why and keeps the fresh model:
a saved model never breaks routing (learned/loop.py).

Pure: no I/O, no clock. A predictor of the operator's own (``type: module:attr``) is not saved.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import ValidationError

from inferlb.errors import InferlbError
from inferlb.routing.features import FEATURE_NAMES, N_FEATURES
from inferlb.routing.lifecycle import LifecycleParams
from inferlb.routing.predictor import OnlineLinear, OnlineLinearParams

__all__ = ["FORMAT", "IncompatibleState", "restore", "state_of"]

FORMAT = "inferlb.online-linear/1"


class IncompatibleState(InferlbError, ValueError):
    """A saved predictor this gateway cannot use (the message says why). Still a ``ValueError``, as
    it was before it joined the tree, so a caller that caught it as one still does."""


def state_of(model: object) -> dict[str, Any] | None:
    """``model``'s state as JSON-able data, or None when it is not a predictor this module saves."""
    if not isinstance(model, OnlineLinear):
        return None
    return {"format": FORMAT, "type": model.type_name, "features": list(FEATURE_NAMES),
            "params": model.p.model_dump(), "version": int(model.version), "seen": int(model.seen),
            "d": [m.tolist() for m in model._d], "e": [v.tolist() for v in model._e], "w": model.w.tolist()}


def _array(state: Mapping[str, Any], key: str, shape: tuple[int, ...]) -> np.ndarray:
    try:
        a = np.asarray(state[key], dtype=float)
    except (KeyError, TypeError, ValueError) as exc:
        raise IncompatibleState(f"{key}: missing or not numbers ({type(exc).__name__})") from None
    if a.shape != shape:
        raise IncompatibleState(f"{key}: shape {a.shape}, expected {shape}")
    if not np.all(np.isfinite(a)):
        raise IncompatibleState(f"{key}: holds a value that is not a finite number")
    return a


def restore(state: Any, params: LifecycleParams) -> OnlineLinear:
    """The model ``state`` describes, if it fits ``params`` (see the module docstring)."""
    if not isinstance(state, Mapping):
        raise IncompatibleState(f"not a mapping but {type(state).__name__}")
    if state.get("format") != FORMAT:
        raise IncompatibleState(f"format {state.get('format')!r}, this gateway reads {FORMAT!r}")
    if params.type != "online-linear" or state.get("type") != "online-linear":
        raise IncompatibleState(f"saved predictor type {state.get('type')!r}, configured {params.type!r}")
    if state.get("features") != list(FEATURE_NAMES):
        raise IncompatibleState("saved with other features (another gateway version)")
    try:
        want = OnlineLinearParams.model_validate(params.params)
        saved = OnlineLinearParams.model_validate(state.get("params"))
    except ValidationError as exc:
        raise IncompatibleState(f"params: {exc.errors()[0]['msg']}") from None
    if saved != want:
        raise IncompatibleState(f"saved with params {saved.model_dump()}, configured {want.model_dump()}")
    version, seen = state.get("version"), state.get("seen")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise IncompatibleState(f"version {version!r} is not a positive integer")
    if not isinstance(seen, int) or isinstance(seen, bool) or seen < 0:
        raise IncompatibleState(f"seen {seen!r} is not a count")
    n = N_FEATURES
    d = _array(state, "d", (2, n, n))
    e = _array(state, "e", (2, n))
    w = _array(state, "w", (n, 2))
    m = OnlineLinear(want, version=version)
    m._d = [d[0].copy(), d[1].copy()]
    m._e = [e[0].copy(), e[1].copy()]
    m.seen = seen
    m._set_weights(w)
    return m
