"""Priority class and deadline resolution (``identify``): header, default, ceiling, class deadline."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from inferlb.engine.admission.auth import identify
from inferlb.engine.admission.keys import ApiKey
from inferlb.engine.errors import InvalidRequest, ModelNotFound

from .rig import make_rig


def _request(ctl: Any, key: ApiKey | None = None) -> Any:
    return SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(admission=ctl)),
                           state=SimpleNamespace(api_key=key))


def test_header_default_and_class_deadline() -> None:
    ctl = make_rig().ctl
    who = identify(_request(ctl), "label", "critical", None)
    assert (who.tenant, who.priority, who.deadline_s, who.key_id) == ("label", "critical", 30.0, None)
    who = identify(_request(ctl), None, None, 2.5)
    assert (who.priority, who.deadline_s) == ("standard", 2.5)       # the client's deadline wins
    with pytest.raises(InvalidRequest):
        identify(_request(ctl), None, "platinum", None)


def test_key_tenant_and_ceiling() -> None:
    ctl = make_rig().ctl
    key = ApiKey(id="k", tenant="acme", key_hash="h", hint="x", priority_ceiling="standard", models=("m",))
    who = identify(_request(ctl, key), "spoofed", "critical", None)
    assert (who.tenant, who.priority, who.deadline_s, who.key_id) == ("acme", "standard", 120.0, "k")
    assert identify(_request(ctl, key), None, "batch", None).priority == "batch"    # below the ceiling: kept
    who.check_model("m")
    with pytest.raises(ModelNotFound):
        who.check_model("other")
    odd = ApiKey(id="k2", tenant="t", key_hash="h2", hint="x", priority_ceiling="retired-class")
    assert identify(_request(ctl, odd), None, "critical", None).priority == "batch"  # unknown ceiling: lowest


def test_unauthenticated_ceiling() -> None:
    ctl = make_rig({"unauthenticated_ceiling": "interactive"}).ctl
    assert identify(_request(ctl), None, "critical", None).priority == "interactive"
