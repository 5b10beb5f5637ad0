"""BPMN runtime: parse + validate once, executors (compiled, spiff), external tasks.

Receives the service table injected by ``app.py``; never imports ``tasks``.
"""

__all__: list[str] = []
