"""Priority class and deadline resolution (``identity``): header, default, ceiling, class deadline."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from inferlb.admission.keys import ApiKey
from inferlb.api.auth import identity
from inferlb.errors import InvalidRequest, ModelNotFound
from tests.admission.rig import make_rig


def _request(key: ApiKey | None = None) -> Any:
    """What ``authenticate`` leaves on the request: its key (None while auth is off)."""
    return SimpleNamespace(state=SimpleNamespace(api_key=key))


def test_header_default_and_class_deadline() -> None:
    ctl = make_rig().ctl
    who = identity(_request(), ctl, "label", "critical", None)
    assert (who.tenant, who.priority, who.deadline_s, who.key_id) == ("label", "critical", 30.0, None)
    who = identity(_request(), ctl, None, None, 2.5)
    assert (who.priority, who.deadline_s) == ("standard", 2.5)       # the client's deadline wins
    with pytest.raises(InvalidRequest):
        identity(_request(), ctl, None, "platinum", None)


def test_key_tenant_and_ceiling() -> None:
    ctl = make_rig().ctl
    key = ApiKey(id="k", tenant="acme", key_hash="h", hint="x", priority_ceiling="standard", models=("m",))
    who = identity(_request(key), ctl, "spoofed", "critical", None)
    assert (who.tenant, who.priority, who.deadline_s, who.key_id) == ("acme", "standard", 120.0, "k")
    assert identity(_request(key), ctl, None, "batch", None).priority == "batch"    # below the ceiling: kept
    who.check_model("m")
    with pytest.raises(ModelNotFound):
        who.check_model("other")
    odd = ApiKey(id="k2", tenant="t", key_hash="h2", hint="x", priority_ceiling="retired-class")
    assert identity(_request(odd), ctl, None, "critical", None).priority == "batch"  # unknown ceiling: lowest


def test_unauthenticated_ceiling() -> None:
    ctl = make_rig({"unauthenticated_ceiling": "interactive"}).ctl
    assert identity(_request(), ctl, None, "critical", None).priority == "interactive"
