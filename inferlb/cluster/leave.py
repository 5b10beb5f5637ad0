"""A replica known to be dead leaves the cluster at once: its shares, heartbeat and role go back.

Called by a supervisor that saw its process exit (``serve --workers``, inferlb/cli/serve.py), so the
others need not wait for its lease to run out (inferlb/cluster/service.py, "Idle lease").

Contract of :func:`forget_replica`: delete ``replica``'s field from the ``replicas`` hash and from
every ``slots:*`` hash under ``prefix``, end the database leases it holds
(:func:`~.election.release_holder`) when an engine is given, then publish
``{"t": "left", "from": "supervisor", "replica": …}`` on the cluster channel, on which every
replica syncs and tries for the role at once. Blocking (a few commands to a local Redis);
failures are logged and returned as False, never raised: the leases still run out on their own.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from inferlb.cluster.election import release_holder

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

__all__ = ["forget_replica"]

log = logging.getLogger("inferlb.cluster")


def forget_replica(redis_url: str, prefix: str, replica: str, *, engine: Engine | None = None) -> bool:
    """See the module docstring. True when Redis took every command."""
    import redis
    from redis.exceptions import RedisError

    if engine is not None:
        release_holder(engine, replica)
    base = prefix + "cluster:"
    try:
        with redis.Redis.from_url(redis_url, socket_timeout=2.0, socket_connect_timeout=2.0) as r:
            slots = list(r.scan_iter(match=base + "slots:*", count=1000))
            with r.pipeline(transaction=False) as pipe:
                pipe.hdel(base + "replicas", replica)
                for key in slots:
                    pipe.hdel(key, replica)
                pipe.publish(base + "events", json.dumps({"t": "left", "from": "supervisor", "replica": replica}))
                pipe.execute()
    except (RedisError, OSError) as exc:
        log.warning("could not remove the shares of %s (%s); they come back when its lease runs out", replica, exc)
        return False
    return True
