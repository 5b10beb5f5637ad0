"""The fleet's live state: nodes as the gateway sees them, and the health state machine's arithmetic.

``state`` holds :class:`Fleet` (the nodes, their transitions, the snapshots routing reads), ``node``
one node's :class:`NodeState`, ``rules`` the ejection and slow-start arithmetic the transitions
apply, ``gpu`` the GPU vocabulary (throttle bits, Xid names) health sources and rules share.
"""
