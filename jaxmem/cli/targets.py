"""``jaxmem targets``: every named target, its devices and memory, and whether its compiler
works here."""

from __future__ import annotations

import argparse

import jaxmem
from jaxmem.cli import _common as c
from jaxmem.render import tables


def register(subparsers: argparse._SubParsersAction) -> None:
  p = subparsers.add_parser("targets", help="list compilation targets: devices, memory, compiler installed")
  p.add_argument("--format", default="table", type=jaxmem.inputs.Choice(tables.FORMATS), help="table, markdown, json or csv")
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  tables.check_format(args.format)
  c.start(None)
  print(tables.render_records(jaxmem.list_targets(), args.format, made_by=tables.made_by("targets", jaxmem.inputs.TARGETS)))
  return 0
