"""HTTP routes: one router per file, thin adapters over the features and the request path.

Routers: OpenAI, admin, audit, keys, nodes, rollouts, capacity, health, metrics, dashboard.
``deps.py`` is the one reader of
``app.state``; routers take its ``Annotated`` types. No route imports ``tasks`` or SpiffWorkflow.
"""
