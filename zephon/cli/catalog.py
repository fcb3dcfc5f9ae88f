"""``zephon catalog build URI [--out PATH]``: build a dataset's shard catalog and publish it.

Builds the catalog of a dataset directory (local, or in object storage) and publishes it next
to the data as ``URI/.zephon-catalog.json``, or writes it to ``--out``; see
:func:`zephon.io.build_catalog`.
"""
from __future__ import annotations

import argparse
import sys

NAME = "catalog"
HELP = "shard catalogs of dataset directories: 'zephon catalog build URI' publishes one next to the data"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The catalog command's subcommands (``build``) and their options."""
    commands = parser.add_subparsers(dest="catalog_command", metavar="SUBCOMMAND", required=True)
    build = commands.add_parser("build", help="build the catalog of URI and publish it next to the data",
                                description="Build the catalog of a dataset directory (a path, s3://, gs://, "
                                            "abfs://, hdfs:// URI) and publish it as URI/.zephon-catalog.json, "
                                            "or write it to --out.")
    build.add_argument("uri", help="the dataset directory")
    build.add_argument("--out", default=None, help="write the catalog to this local path instead")
    build.add_argument("--format", default=None, dest="fmt", help="parquet, jsonl or arrow (default: detect)")


def run(args: argparse.Namespace) -> int:
    """Build and publish the catalog; returns the exit status (2 if it cannot be built)."""
    from zephon.io import build_catalog

    try:
        written = build_catalog(args.uri, args.out, fmt=args.fmt, progress=None)
    except (ValueError, OSError) as error:
        print(f"zephon catalog build: error: {error}", file=sys.stderr)
        return 2
    print(f"zephon: catalog of {args.uri} written to {written}")
    return 0
