"""Other features' messages on the cluster channel (ClusterService.subscribe, used by
learned/share.py), on real Redis: a message of a subscribed type that another replica publishes
reaches the handler; this replica's own, and unknown types, do not; a handler that raises does
not stop the listener; ``status()`` carries the subscribers' parts."""

from __future__ import annotations

import json
from typing import Any

from tests.cluster.test_health_redis import _started, _until


async def test_a_subscribed_message_reaches_its_handler_and_nothing_else_does(make_replica: Any) -> None:
    a, b = await _started(make_replica, "a", "b")
    got: list[dict[str, Any]] = []
    calls = {"boom": 0}

    def boom(msg: dict[str, Any]) -> None:
        calls["boom"] += 1
        raise RuntimeError("a broken subscriber")

    b.subscribe("learned", got.append)
    b.subscribe("boom", boom)
    b.parts["learned"] = lambda: {"mode": "follower"}
    for msg in ({"t": "boom", "from": "a"}, {"t": "learned", "from": "b", "seq": 1},   # b's own: dropped
                {"t": "other", "from": "a"}, {"t": "learned", "from": "a", "seq": 2}):
        await a.redis.publish(a.channel, json.dumps(msg))
    await _until(lambda: len(got) == 1)
    assert got == [{"t": "learned", "from": "a", "seq": 2}] and calls["boom"] == 1   # the listener went on
    assert b.status()["learned"] == {"mode": "follower"}
