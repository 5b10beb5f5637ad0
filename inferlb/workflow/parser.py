"""Parse BPMN files with SpiffWorkflow, reading service operations from either
``spiffworkflow:serviceTaskOperator`` or Camunda's external-task ``camunda:topic``.

The stock parsers drop the Camunda topic, so :class:`OperationTaskParser` reads it and builds an
:class:`OperationTask` spec that keeps ``operation``, ``params`` (name -> Python expression) and
``result_variable`` (``None``: the operation's default from the service table).
"""

from __future__ import annotations

from typing import Any, ClassVar

from lxml import etree
from SpiffWorkflow.bpmn.parser.BpmnParser import full_tag
from SpiffWorkflow.bpmn.parser.task_parsers import ConditionalGatewayParser
from SpiffWorkflow.bpmn.parser.ValidationException import ValidationException
from SpiffWorkflow.bpmn.specs.defaults import ExclusiveGateway, ServiceTask
from SpiffWorkflow.spiff.parser.process import VALIDATOR, SpiffBpmnParser
from SpiffWorkflow.spiff.parser.task_spec import SpiffTaskParser

__all__ = ["CAMUNDA_NS", "InferlbParser", "LazyExclusiveGateway", "OperationTask", "OperationTaskParser",
           "element_tags", "make_parser",
           "sequence_flows"]

CAMUNDA_NS = "http://camunda.org/schema/1.0/bpmn"


class OperationTask(ServiceTask):  # type: ignore[misc]
    """A service task naming an inferlb operation.

    Run by the spiff executor through ``workflow.script_engine.run_operation(task)`` which either
    runs the operation (returns True) or parks the task for the async layer (returns None).
    """

    def __init__(
        self,
        wf_spec: Any,
        bpmn_id: str,
        *,
        operation: str,
        params: dict[str, str],
        result_variable: str | None,
        **kwargs: Any,
    ) -> None:
        super().__init__(wf_spec, bpmn_id, **kwargs)
        self.operation = operation
        self.params = params
        self.result_variable = result_variable

    def _run_hook(self, task: Any) -> bool | None:
        result: bool | None = task.workflow.script_engine.run_operation(task, self)
        return result


class LazyExclusiveGateway(ExclusiveGateway):  # type: ignore[misc]
    """``bpmn:exclusiveGateway`` that can leave its branches unpredicted until it runs.

    When an instance reaches a gateway, SpiffWorkflow predicts every outgoing branch (MAYBE /
    LIKELY tasks, each with predicted children of its own) and removes all but the chosen one
    when the gateway runs: in the request process that is about a third of the tasks an instance
    creates, each with a random UUID and its own data. With ``predict_branches`` False only the
    chosen branch is ever built: ``ExclusiveChoice._run_hook`` creates it (and predicts below it)
    whether or not it was predicted, so the tasks that run, their order and their data are the
    same. The spiff executor turns prediction off only for processes with nothing that reads
    predicted tasks (no joins, inclusive or event gateways, catch or boundary events; see
    ``SpiffExecutor``); the hook is SpiffWorkflow's documented override point for predictions.
    """

    predict_branches = True

    def _predict_hook(self, my_task: Any) -> None:
        if self.predict_branches:
            super()._predict_hook(my_task)


class OperationTaskParser(SpiffTaskParser):  # type: ignore[misc]
    """Reads ``spiffworkflow:serviceTaskOperator`` or ``camunda:topic`` (+ ``camunda:inputParameter``)."""

    def create_task(self) -> OperationTask:
        ext = self.parse_extensions()
        operator = ext.get("serviceTaskOperator")
        node = self.node
        if operator is not None:
            op = operator["name"]
            params = {k: v["value"] for k, v in operator["parameters"].items()}
            result_var = operator.get("resultVariable") or None
        else:
            op = node.get(f"{{{CAMUNDA_NS}}}topic") or ""
            if not op:
                raise ValidationException(
                    "service task names no operation: set camunda:topic (external task) or "
                    "spiffworkflow:serviceTaskOperator",
                    node=node,
                    file_name=self.filename,
                )
            params = {}
            for p in node.iter(f"{{{CAMUNDA_NS}}}inputParameter"):
                params[p.get("name")] = (p.text or "").strip()
            result_var = None
        for name, expr in params.items():
            try:
                compile(expr, f"<{self.bpmn_id}.{name}>", "eval")
            except SyntaxError as exc:
                raise ValidationException(
                    f"parameter {name!r} is not a Python expression: {exc.msg}",
                    node=node,
                    file_name=self.filename,
                ) from exc
        return OperationTask(
            self.spec,
            self.bpmn_id,
            operation=op,
            params=params,
            result_variable=result_var,
            **self.bpmn_attributes,
        )


class InferlbParser(SpiffBpmnParser):  # type: ignore[misc]
    """SpiffWorkflow's parser with inferlb's service-task handling."""

    OVERRIDE_PARSER_CLASSES: ClassVar[dict[str, Any]] = {
        **SpiffBpmnParser.OVERRIDE_PARSER_CLASSES,
        full_tag("serviceTask"): (OperationTaskParser, OperationTask),
        full_tag("exclusiveGateway"): (ConditionalGatewayParser, LazyExclusiveGateway),
    }


def make_parser(validate: bool = True) -> InferlbParser:
    """A parser that validates against the BPMN XSD (with SpiffWorkflow's extension schema)."""
    return InferlbParser(validator=VALIDATOR if validate else None)


def element_tags(path: str) -> list[tuple[str, str]]:
    """(element id, local tag name) of every flow element of every process in the file."""
    tree = etree.parse(path)
    out: list[tuple[str, str]] = []
    for proc in tree.getroot().iter(full_tag("process")):
        for el in proc:
            if not isinstance(el.tag, str):
                continue
            out.append((el.get("id") or "?", etree.QName(el).localname))
    return out


def sequence_flows(path: str) -> dict[tuple[str, str], str]:
    """(source id, target id) -> sequence flow id, for every flow of every process in the file."""
    tree = etree.parse(path)
    out: dict[tuple[str, str], str] = {}
    for flow in tree.getroot().iter(full_tag("sequenceFlow")):
        src, tgt, fid = flow.get("sourceRef"), flow.get("targetRef"), flow.get("id")
        if src and tgt and fid:
            out.setdefault((src, tgt), fid)
    return out
