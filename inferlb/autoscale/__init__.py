"""Predictive autoscaling: forecast load, plan replicas per model and GPU type, actuate, record.

Layout: ``config`` (the fleet file's ``autoscale:`` section), ``forecast`` (forecasters),
``capacity`` (tokens/s at SLO per replica, learned from the audit trail), ``planner`` (pure: the
plan), ``policy`` (:class:`Autoscaler`, the ``observe → forecast → plan`` object a backtest drives),
``actuators/`` (dry-run, local, kubernetes, webhook), ``fleet_port`` (the local actuator adds,
drains and removes gateway nodes through the live node-admin operations), ``runner`` (runs
``processes/autoscale.bpmn`` every interval on one replica), ``scope`` (what the ``autoscale/*``
service operations act on), ``advice`` (the capacity report's words). Importing this package creates
nothing.
"""

from inferlb.autoscale.policy import Autoscaler, LoadHistory
from inferlb.config.autoscale import ActuatorConfig, AutoscaleConfig, PoolConfig

__all__ = ["ActuatorConfig", "AutoscaleConfig", "Autoscaler", "LoadHistory", "PoolConfig"]
