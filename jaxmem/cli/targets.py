"""``jaxmem targets``: every named target, its devices and memory, and whether its compiler
works here."""

from __future__ import annotations

import argparse

import jaxmem
from jaxmem.cli import _common as c
from jaxmem.render import columns as cols
from jaxmem.render import tables


def register(subparsers: argparse._SubParsersAction) -> None:
  p = subparsers.add_parser("targets", help="list compilation targets: devices, memory, compiler installed")
  p.add_argument("--format", default="table", type=jaxmem.inputs.Choice(tables.FORMATS), help="table, markdown, json or csv")
  c.add_columns(p, cols.TARGETS)
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  tables.check_format(args.format)
  columns = c.columns(args, cols.TARGETS)
  c.tell("jaxmem: targets: trying each TPU and GPU compiler installed here")
  c.start(None)
  print(tables.render_listing(jaxmem.list_targets(), args.format, cols.TARGETS, columns,
                              made_by=tables.made_by("targets", jaxmem.inputs.TARGETS)))
  return 0
