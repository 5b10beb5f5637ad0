"""Predictive autoscaling: forecast load, plan replicas per model and GPU type, actuate, record.

Layout: its config is ``inferlb/config/autoscale.py`` (the fleet file's ``autoscale:`` section);
here ``forecast`` (forecasters), ``capacity`` (tokens/s at SLO per replica, learned from the audit
trail), ``capacity_query`` (the capacity report's query), ``planner`` (pure: the plan), ``policy``
(:class:`~.policy.Autoscaler`, the ``observe → forecast → plan`` object a backtest drives), ``actuators``
(the table) and ``actuator_*`` (dry-run, local, kubernetes, webhook), ``fleet_port`` (the local
actuator adds, drains and removes gateway nodes through the live node-admin operations),
``runner`` (runs ``processes/autoscale.bpmn`` every interval on one replica), ``scope`` (what the
``autoscale/*`` service operations act on), ``store`` (the ``scaling_events`` queries),
``advice`` (the capacity report's words). Importing this package creates nothing.
"""

__all__: list[str] = []
