"""Cost-tiered model choice: a model alias sends each request to a cheaper or a stronger model.

Which one is decided by the request's difficulty.

Layout: ``classify`` (pure: the request's named features and its difficulty score in [0, 1] with
each feature's contribution), ``guard`` (the feedback guard: a cheaper tier whose error or SLO-miss
rate rises loses its traffic to the stronger tier, with hysteresis and a cool-down; time injected),
``learned`` (an online logistic regression of a tier's success, trained from request outcomes with a
held-out split), ``router`` (:class:`~inferlb.tiers.router.TierRouter`: the choice ``request/evaluate``
makes, its audit entry, the outcome feedback, what the admin route shows), ``metrics`` (Prometheus).
The fleet-file schema is ``config/tiers.py``. This ``__init__`` imports nothing.
"""

__all__: list[str] = []
