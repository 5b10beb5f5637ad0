"""Several gateway replicas behaving as one, on one Redis and one database.

What it holds: global admission (slot shares leased from Redis),
shared node health, the election of the replica that runs once-only background work, and what
each replica does while Redis is away.

Layout: ``config`` (``INFERLB_CLUSTER_*``), ``lua`` (the Redis scripts, on the server's clock),
``shares`` (this replica's share of every limit; pure), ``admission`` (the controller subclass
that reads the shares), ``health`` (ejections and cool-downs as one state), ``election`` (the
database lease with its fencing token), ``service`` (the loops, degraded mode, config hashes,
metrics). Only ``create_app`` builds any of it, and only when the cluster is on: one replica
alone runs the plain controller with no cluster code on its request path.
"""

__all__: list[str] = []
