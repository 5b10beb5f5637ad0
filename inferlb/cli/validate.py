"""``inferlb validate``: check a BPMN process and/or a fleet file as the gateway would at start-up.

::

    inferlb validate [FILE] [--config FLEET] [--engine auto|spiff|compiled] [--no-required]

``FILE`` is parsed and validated against the contract of the process it is (request, node health
or rollout: the tasks it must have and its start data) and the executor it would run on is printed;
``--config`` validates the fleet file with the processes the gateway would load. Every problem is
one line on stderr (file, element id or key path, problem). Exit status 0 when everything is
valid, 1 when something is not, 2 when neither ``FILE`` nor ``--config`` is given.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from inferlb.cli.shared import one_line, settings_from
from inferlb.errors import ConfigError, ProcessValidationError

__all__ = ["register", "validate_command"]


def register(sub: Any) -> None:
    """Add ``validate`` to the ``inferlb`` parser's subcommands."""
    v = sub.add_parser("validate", help="parse and validate a BPMN process")
    v.add_argument("file", type=Path, nargs="?", help="a BPMN process file")
    v.add_argument("--config", type=Path, help="a fleet file: validated with the processes the gateway would load")
    v.add_argument("--engine", choices=["auto", "spiff", "compiled"])
    v.add_argument("--no-required", action="store_true", help="do not require the request-process tasks")
    v.set_defaults(handler=validate_command)


def _print_problems(exc: ProcessValidationError | ConfigError) -> None:
    """One line per problem on stderr: file, element id or key path, problem."""
    if isinstance(exc, ProcessValidationError):
        for eid, msg in exc.problems:
            print(f"inferlb: error: {one_line(f'{exc.source}: {eid}: {msg}')}", file=sys.stderr)
    else:
        print(f"inferlb: error: {one_line(str(exc))}", file=sys.stderr)


def validate_command(args: argparse.Namespace) -> int:
    """Run ``inferlb validate`` (the module docstring says what it prints and returns)."""
    from inferlb.app import check_startup_files
    from inferlb.tasks import HEALTH_CONTRACT, REQUEST_CONTRACT, ROLLOUT_CONTRACT, SERVICES
    from inferlb.workflow.definition import load_process

    if args.file is None and args.config is None:
        print("inferlb: error: validate needs a BPMN FILE, --config FLEET, or both", file=sys.stderr)
        return 2
    failed = False
    if args.file is not None:
        contract = REQUEST_CONTRACT
        engine = args.engine or "auto"
        text = Path(args.file).read_text(errors="replace") if Path(args.file).is_file() else ""
        if "health/probe" in text or "rollout/observe" in text:
            # A node-health or rollout process: its own required tasks and start data; always on SpiffWorkflow.
            contract = HEALTH_CONTRACT if "health/probe" in text else ROLLOUT_CONTRACT
            engine = args.engine or "spiff"
        try:
            d = load_process(args.file, SERVICES, engine=engine,
                             required={} if args.no_required else dict(contract.required),
                             start_data=contract.start_data)
        except ProcessValidationError as exc:
            _print_problems(exc)
            failed = True
        else:
            print(f"OK {d.path} (process {d.process_id}): executor {d.mode}")
            for eid, why in d.compiled_problems:
                print(f"  runs on spiff because {eid} is outside the compiled subset ({why})")
    if args.config is not None:
        try:
            settings = settings_from(args)
            checked = check_startup_files(settings)
        except (ConfigError, ProcessValidationError) as exc:
            _print_problems(exc)
            failed = True
        else:
            print(f"OK {args.config}: {len(checked.fleet.nodes)} node(s), {len(checked.fleet.models)} model(s); "
                  f"{checked.request_process.path} (executor {checked.request_process.mode}), "
                  f"{checked.health_process.path} (executor {checked.health_process.mode})"
                  + (f", {checked.rollout_process.path} (executor {checked.rollout_process.mode})"
                     if checked.rollout_process is not None else ""))
    return 1 if failed else 0
