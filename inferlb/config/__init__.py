"""Configuration: INFERLB_* settings and the fleet-file schema, one module per feature's config.

``settings`` holds :class:`Settings` (environment), :class:`FleetConfig` (the fleet file) and
:func:`load_settings`; each feature's section of the fleet file is a module here (``admission``,
``autoscale``, ``cluster``, ``discovery``, ``health``, ``observability``, ``rollout``, ``versions``),
which the features import downward. Nothing here imports a feature.
"""
