"""Start-up checks: everything in the operator's files that can be wrong, found before a port is bound.

``check_files`` is pure (it reads files, changes nothing): it returns the validated fleet and the
two process definitions, or raises :class:`~inferlb.errors.ConfigError` /
:class:`~inferlb.errors.ProcessValidationError`, whose one-line ``str`` names the file, the
key path or element id, and the problem. ``inferlb validate --config`` runs it alone; ``inferlb
serve`` / ``demo`` run it and :func:`check_journal_dir` before the app starts, so a bad file is one
line on stderr and a non-zero exit, not a traceback from inside the server's lifespan.

The service table and the process contracts (required tasks, start data) are injected by the
caller: the engine does not import ``tasks``.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from inferlb.config.settings import FleetConfig, Settings
from inferlb.errors import ConfigError
from inferlb.health.monitor import check_health_config
from inferlb.workflow.definition import ProcessDefinition, load_process
from inferlb.workflow.services import ProcessContract, ServiceTable

__all__ = ["Checked", "check_files", "check_journal_dir"]


@dataclass(frozen=True)
class Checked:
    fleet: FleetConfig
    request_process: ProcessDefinition
    health_process: ProcessDefinition
    autoscale_process: ProcessDefinition | None = None   # loaded when the fleet has autoscale: (enabled)
    rollout_process: ProcessDefinition | None = None    # rollout.bpmn (when a rollout contract is given)


def check_files(settings: Settings, services: ServiceTable, *, processes_dir: Path,
                request: ProcessContract, health: ProcessContract,
                autoscale: ProcessContract | None = None, rollout: ProcessContract | None = None) -> Checked:
    """The fleet (inline or from ``settings.config``) and both processes, validated; with an
    enabled ``autoscale:`` section (and its contract), ``autoscale.bpmn`` too; with the rollout
    contract, the rollout process (always on SpiffWorkflow, like node health)."""
    fleet = settings.resolved_fleet()
    try:
        check_health_config(fleet)
        for i, n in enumerate(fleet.nodes):
            # The file's nodes are this replica's to serve: a key it cannot read is a start-up error
            # (nodes added live are checked by the API instead, and reported per replica on apply).
            if n.missing_key_env is not None:
                raise ConfigError(f"node {n.name!r}: environment variable {n.missing_key_env} (its api_key_env) is "
                                  f"not set or empty", path=f"nodes[{i}].api_key_env")
    except ConfigError as exc:
        source = str(settings.config) if settings.fleet is None and settings.config is not None else None
        raise ConfigError(exc.message, source=source, path=exc.path) from exc
    pdir = settings.processes_dir or processes_dir
    req = load_process(pdir / settings.request_process, services, engine=settings.engine,
                       required=dict(request.required), start_data=request.start_data)
    hp = load_process(pdir / fleet.health.process, services, engine="spiff",
                      required=dict(health.required), start_data=health.start_data)
    ap = None
    if autoscale is not None and fleet.autoscale is not None and fleet.autoscale.enabled:
        ap = load_process(pdir / "autoscale.bpmn", services, engine="spiff", required=dict(autoscale.required),
                          start_data=autoscale.start_data)
    rp = None
    if rollout is not None:
        rp = load_process(pdir / fleet.rollouts.process, services, engine="spiff",
                          required=dict(rollout.required), start_data=rollout.start_data)
    return Checked(fleet, req, hp, autoscale_process=ap, rollout_process=rp)


def check_journal_dir(path: Path) -> None:
    """Create the audit journal directory and prove a file can be written there (a probe file,
    removed again); ConfigError naming INFERLB_JOURNAL_DIR and the directory otherwise."""
    probe = path / f".inferlb-write-probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"probe\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"the audit journal directory {str(path)!r} is not writable: "
                          f"{exc.strerror or exc}", source="environment", path="INFERLB_JOURNAL_DIR") from exc
