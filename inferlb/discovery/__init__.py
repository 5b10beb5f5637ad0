"""Node discovery: nodes that come from an orchestrator instead of the fleet file.

* ``config.py``: the ``discovery:`` section (``kind: kubernetes``);
* ``slices.py``: pure: EndpointSlices → node specs, and the diff (add, drain, remove when drained);
* ``kubernetes.py``: the blocking list / watch with the ``kubernetes`` client (worker thread);
* ``source.py``: one source on the event loop (list → watch, 410 → relist, errors keep the nodes);
* ``metrics.py``, ``wiring.py``: its Prometheus collector; building the sources in ``create_app``.

Discovered nodes join through the live config (live/manager.py ``set_discovered``) and
live/fleet_admin.py, the same path as a node an operator adds.
"""

from __future__ import annotations

__all__: list[str] = []
