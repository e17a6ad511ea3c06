"""Command line: a thin layer over the library. ``main(argv) -> int`` so tests call it directly.

This module only assembles the commands: each lives in its own module with a
``register(subparsers)``; what they share is in :mod:`jaxmem.cli._common`. Bad input is one line
on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from jaxmem.cli import _common, compare, estimate, explain, fit, infer, models, scale, targets, validate
from jaxmem.errors import JaxmemError

# In the order `jaxmem --help` lists them.
COMMANDS = (compare, infer, estimate, explain, fit, scale, validate, targets, models)


def build_parser() -> argparse.ArgumentParser:
  parser = _common.Parser(prog="jaxmem", description="Will it fit? XLA's own per-device memory figures for JAX train steps.")
  sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_common.Parser)
  sub.required = True
  for command in COMMANDS:
    command.register(sub)
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  parser = build_parser()
  try:
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    return args.func(args)
  except JaxmemError as e:
    print(f"jaxmem: error: {_common.flag_message(e, parser)}", file=sys.stderr)  # fields named as flags
    return 2
  except SystemExit as e:  # --help
    return e.code if isinstance(e.code, int) else 0


if __name__ == "__main__":
  sys.exit(main())
