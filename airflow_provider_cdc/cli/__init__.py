"""``airflow cdc`` (or ``airflow-cdc``): status, verify, resync, export-debezium, snapshot,
drop-source, doctor and sources from the command line (docs/cli.md).

Registered through the provider's CLI entry (``get_provider_info()["cli"]`` ->
:func:`get_cli_commands`); the arguments are defined once, in :func:`_parser`. Exit codes: 0
done or ready, 1 a finding (a mismatch, an error, not caught up yet), 2 cannot run. A source's
credentials come from its Airflow connection, never from the command line.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any

from ..core.errors import CdcError
from .common import EXIT_ERROR, EXIT_MISMATCH, EXIT_OK
from .doctor_cmd import cmd_doctor, cmd_sources
from .parser import _parser
from .sources import cmd_drop_source, cmd_snapshot
from .status_cmd import cmd_status, describe_lag, describe_progress
from .tables import cmd_export_debezium, cmd_mirror_version, cmd_resync, cmd_verify


def main(argv: list[str] | None = None) -> int:
    """Entry point. As the console command (``argv`` None) it ends with ``os._exit``: delta-rs
    threads can abort the interpreter's teardown (SIGABRT, "terminate called without an active
    exception", delta-io/delta-rs#2184), which would turn a clean verify into exit code 134."""
    code = run(argv)
    if argv is None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


COMMANDS = {
    "status": cmd_status,
    "verify": cmd_verify,
    "resync": cmd_resync,
    "export-debezium": cmd_export_debezium,
    "mirror-version": cmd_mirror_version,
    "snapshot": cmd_snapshot,
    "drop-source": cmd_drop_source,
    "doctor": cmd_doctor,
    "sources": cmd_sources,
}


def run(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return _dispatch(args.command, args)


@contextlib.contextmanager
def _quiet_airflow():
    """While a command runs, Airflow's own INFO lines ("creating dag run", the DagBag's filling)
    are not its output: only Airflow's warnings and errors reach the terminal
    (AIRFLOW__LOGGING__LOGGING_LEVEL=DEBUG still shows everything). The levels are put back
    after the command (a command run in-process, as tests and ``airflow cdc`` do, leaves the
    process's logging as it found it)."""
    import importlib
    import logging

    if os.environ.get("AIRFLOW__LOGGING__LOGGING_LEVEL", "").upper() == "DEBUG":
        yield
        return
    stdlib = logging.getLogger("airflow")
    before = stdlib.level
    stdlib.setLevel(logging.WARNING)
    # Airflow 3's structlog loggers take their level per namespace from a table (the core's and
    # the task SDK's copies); a namespace level the deployment set stays
    added = []
    for module in ("airflow._shared.logging.structlog", "airflow.sdk._shared.logging.structlog"):
        try:
            levels = importlib.import_module(module).PER_LOGGER_LEVELS
            if "airflow" not in levels:
                levels["airflow"] = logging.WARNING
                added.append(levels)
        except Exception:  # noqa: BLE001, S112 - another Airflow: its INFO lines show, nothing else changes
            continue
    try:
        yield
    finally:
        stdlib.setLevel(before)
        for levels in added:
            levels.pop("airflow", None)


def _dispatch(command: str, args: argparse.Namespace) -> int:
    from ..hooks.connections import read_metadata_database

    read_metadata_database()  # a command runs outside a task: connections of the UI are in the database
    try:
        with _quiet_airflow():
            return COMMANDS[command](args)
    except Exception as exc:  # noqa: BLE001 - a missing connection or unreachable source: say so, exit 2
        from ..hooks.task_errors import describe_user_error

        # an unknown connection id or a refused login: named, with what to check (task_errors.py)
        told = (
            describe_user_error(exc, conn_id=getattr(args, "conn_id", None))
            if not isinstance(exc, CdcError) or exc.__cause__ is not None
            else None
        )
        print(
            f"error: {told or (exc if isinstance(exc, CdcError) else f'{type(exc).__name__}: {exc}')}",
            file=sys.stderr,
        )
        return EXIT_ERROR


# --- ``airflow cdc``: the same commands in Airflow's CLI ----------------------------------------
def get_cli_commands() -> list:
    """The provider's CLI entry: one ``cdc`` group whose commands and arguments are read off
    :func:`_parser`, so both entry points parse alike. Runs at every ``airflow`` start: cheap."""
    from airflow.cli.cli_config import ActionCommand, GroupCommand

    parser = _parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in subparsers._choices_actions}
    commands = [
        ActionCommand(
            name=name,
            help=helps.get(name, ""),
            func=_airflow_entry(name),
            description=sub.description or helps.get(name),
            args=[_airflow_arg(a) for a in sub._actions if not isinstance(a, argparse._HelpAction)],
        )
        for name, sub in subparsers.choices.items()
    ]
    return [GroupCommand(name="cdc", help=parser.description or "", subcommands=commands)]


def _airflow_arg(action: argparse.Action):
    """An argparse action of :func:`_parser` as Airflow's ``Arg``."""
    from airflow.cli.cli_config import Arg

    positional = not action.option_strings  # e.g. ``snapshot``'s action: its name is its flag, no dest
    kwargs: dict[str, Any] = (
        {"help": action.help} if positional else {"help": action.help, "dest": action.dest}
    )
    if isinstance(action, argparse._StoreTrueAction):
        kwargs["action"] = "store_true"
    else:
        if isinstance(action, argparse._AppendAction):
            kwargs["action"] = "append"
        for k in ("default", "type", "choices", "nargs", "metavar"):
            if getattr(action, k) is not None:
                kwargs[k] = getattr(action, k)
        if action.required and not positional:
            kwargs["required"] = True
    return Arg(tuple(action.option_strings) or (action.dest,), **kwargs)


def _airflow_entry(command: str):
    def entry(args: argparse.Namespace) -> None:
        code = _dispatch(command, args)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # as main(): delta-rs threads can abort the interpreter's teardown

    return entry


__all__ = [
    "EXIT_ERROR",
    "EXIT_MISMATCH",
    "EXIT_OK",
    "COMMANDS",
    "describe_lag",
    "describe_progress",
    "get_cli_commands",
    "main",
    "run",
]
