"""``jaxmem diff A.json B.json``: what changed between two saved results."""

from __future__ import annotations

import argparse

import jaxmem
from jaxmem.cli import _common as c
from jaxmem.render.diff import render_diff


def register(subparsers: argparse._SubParsersAction) -> None:
  p = subparsers.add_parser(
      "diff", help="what changed between two saved results (explain's or a sweep's --format json): by consumer, "
      "buffer and source line, op, and row",
  )
  p.add_argument("a", metavar="A.json", help="the first result, as jaxmem wrote it with --format json")
  p.add_argument("b", metavar="B.json", help="the second result, of the same command as A (explain's with explain's, "
                 "compare's with compare's)")
  p.add_argument("--top", type=c.COUNT, default=None,
                 help="list the N largest changes of each section (table and markdown; json holds all); default 20")
  p.add_argument("--format", default="table", type=jaxmem.inputs.Choice(("table", "markdown", "json")),
                 help="table, markdown or json; default table")
  p.add_argument("--output", default=None, help="also write the result to this file")
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  if args.top is not None and args.format == "json":
    raise jaxmem.JaxmemError("--top lists the largest changes in a table; --format json holds them all (drop one)")
  c.check_outputs(args)
  top = {} if args.top is None else {"top": args.top}  # not given: render_diff's default
  c.emit(render_diff(jaxmem.diff(args.a, args.b), args.format, **top), args.output)
  return 0
