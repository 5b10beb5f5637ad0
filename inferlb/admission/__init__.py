"""Admission control: priority classes, the bounded gateway queue, load shedding, tenant limits.

What it holds: priority classes, the saturation signal, the bounded gateway queue, load
shedding, tenant keys and their limits (RPM/TPM token buckets, in-process or on Redis), spend
budgets, and the retry budget.

Layout: ``config`` (policy and environment settings), ``keys`` (key format, hashing, the cache),
``buckets`` (token buckets, Redis sync), ``budget`` (retry budget), ``queue`` (the priority
queue of one pool), ``controller`` (the decisions; synchronous, I/O-free), ``service`` (its
background loops), ``auth`` (FastAPI dependencies: tenant keys, the admin key, identity).

Importing the package imports neither FastAPI nor Redis; ``auth`` and ``service`` do, and only
``app.py`` and the API routers import them.
"""

__all__: list[str] = []
