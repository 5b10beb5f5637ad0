"""Canary rollouts: per-version windows, the statistical guard, and the manager of rollout.bpmn.

Layout: ``stats`` and ``guard`` (Wilson / Newcombe bounds on error and SLO-miss rates, Welch
bounds on the ratio of node times; the promote / hold / rollback rule), ``window`` (per-version
counts and node times over a sliding window, fed as requests end), ``state`` (one
rollout), ``manager`` (starting, running and stopping rollouts; :class:`RolloutScope`, what the
process's operations act on), ``rounds`` (the timer that runs ``processes/rollout.bpmn``),
``persist`` and ``store`` (the ``rollouts`` / ``rollout_events`` queries), ``errors`` (its client
errors), ``metrics`` (Prometheus families read at scrape time), ``panel`` (the dashboard's view).
Its config (the fleet file's ``rollouts:`` section, a rollout's criteria and request body) is
``inferlb/config/rollout.py``.
"""

__all__: list[str] = []
