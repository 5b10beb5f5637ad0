"""Canary rollouts: per-version windows, the statistical guard, the manager that runs
``processes/rollout.bpmn`` on a timer, and the rollout's metrics.

Layout: ``config`` (the fleet file's ``rollouts:`` section, a rollout's criteria and request
body), ``stats`` and ``guard`` (Wilson / Newcombe bounds; the promote / hold / rollback rule),
``window`` (per-version counts over a sliding window, fed as requests end), ``state`` (one
rollout), ``manager`` (starting, running and stopping rollouts; :class:`RolloutScope`, what the
process's operations act on), ``metrics`` (Prometheus families read at scrape time). This
package's ``__init__`` imports nothing, so ``settings`` can import ``config`` without pulling in
the database or the workflow engine.
"""

__all__: list[str] = []
