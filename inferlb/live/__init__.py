"""Live operations: the running configuration changed while the gateway serves.

``manager`` holds :class:`LiveConfig` (reload of the fleet file and processes, node overrides, the
swap of every live part), ``fleet_admin`` the node admin operations merged with the file,
``triggers`` what starts a reload besides the API (SIGHUP, file changes), ``startup`` the checks of
everything an operator's files can get wrong, before a port is bound.
"""
