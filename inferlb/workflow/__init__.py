"""BPMN runtime: parse + validate once, executors (compiled, spiff), external tasks.

Receives the service table injected by ``app.py``; never imports ``tasks``.
"""

from inferlb.workflow.base import ExternalCall, Instance, ProcessExecutor, ScriptEnv
from inferlb.workflow.definition import ProcessDefinition, load_process
from inferlb.workflow.spiff import TIMER_OPERATION

__all__ = ["TIMER_OPERATION", "ExternalCall", "Instance", "ProcessDefinition", "ProcessExecutor", "ScriptEnv",
           "load_process"]
