"""The ``zephon`` command: one module per subcommand.

| command | module |
|---|---|
| ``zephon demo`` | :mod:`zephon.cli.demo`: a mixture over synthetic datasets, end to end |
| ``zephon preview CONFIG`` | :mod:`zephon.cli.preview`: a mixture config in numbers and, with ``--plot``, pictures |
| ``zephon inspect CHECKPOINT`` | :mod:`zephon.cli.inspect`: a readable summary of a checkpoint (file or folder) |
| ``zephon catalog build URI`` | :mod:`zephon.cli.catalog`: publish a dataset's shard catalog next to the data |

A subcommand module holds ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``;
adding one is adding its module to :data:`COMMANDS`.
"""
from __future__ import annotations

import argparse
import sys
from types import ModuleType

from zephon.cli import catalog, demo, inspect, preview

COMMANDS: tuple[ModuleType, ...] = (demo, preview, inspect, catalog)


def parser() -> argparse.ArgumentParser:
    """The argument parser of the ``zephon`` command and its subcommands."""
    from zephon import __version__

    top = argparse.ArgumentParser(
        prog="zephon", description="Deterministic, resumable, elastic data mixtures: try, preview and inspect them.")
    top.add_argument("--version", action="version", version=f"zephon {__version__}")
    commands = top.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        sub = commands.add_parser(command.NAME, help=command.HELP, description=command.HELP)
        command.add_arguments(sub)
        sub.set_defaults(run=command.run)
    return top


def main(argv: list[str] | None = None) -> int:
    """Run ``zephon`` with ``argv`` (default: the process's arguments); returns the exit status."""
    top = parser()
    args = top.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        top.print_help()
        return 0
    try:
        status: int = args.run(args)
        return status
    except (ValueError, TypeError, OSError, ImportError) as error:
        print(f"zephon {args.command}: " + " ".join(str(error).split()), file=sys.stderr)  # one line
        return 2
