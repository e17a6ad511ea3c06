"""Command line: a thin layer over the library. ``main(argv) -> int`` so tests call it directly.

This module only assembles the commands: each lives in its own module with a
``register(subparsers)``; what they share is in :mod:`jaxmem.cli._common`. Bad input is one line
on stderr and exit status 2, never a traceback; Ctrl-C prints what was computed so far and
exits 130, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

import jaxmem
from jaxmem import JaxmemError
from jaxmem.cli import _common, compare, diff, estimate, explain, fit, infer, models, plan, scale, targets, validate

# In the order `jaxmem --help` lists them.
COMMANDS = (compare, infer, estimate, explain, diff, fit, plan, scale, validate, targets, models)


def build_parser() -> argparse.ArgumentParser:
  parser = _common.Parser(prog="jaxmem", description="Will it fit? XLA's own per-device memory figures for JAX train steps.")
  parser.add_argument("--version", action=Version, help="print jaxmem's version and the compilers' and exit")
  sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_common.Parser)
  sub.required = True
  for command in COMMANDS:
    command.register(sub)
  for p in sub.choices.values():  # what each absent flag reads, so a command tells one given (_common.refuse_given)
    p.set_defaults(flag_defaults={a.dest: a.default for a in p._actions if a.option_strings})
  return parser


class Version(argparse.Action):
  """``--version``: like argparse's, without wrapping the line at the terminal's width."""

  def __init__(self, option_strings, dest, **kwargs):
    super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

  def __call__(self, parser, namespace, values, option_string=None):
    print(version())
    parser.exit()


def version() -> str:
  """``jaxmem 0.1.0 (jax ..., jaxlib ..., libtpu ..., jax-cuda12-plugin ...)``: jaxmem's version
  and those of the compilers installed, read from their distributions (nothing is started)."""
  compilers = ", ".join(f"{k} {v}" for k, v in jaxmem.compiler_versions().items())
  return f"jaxmem {jaxmem.__version__} ({compilers})"


def main(argv: Sequence[str] | None = None) -> int:
  parser = build_parser()
  args = None
  traceback_too = False
  try:
    jaxmem.inputs.check_environment()  # jaxmem's own variables, before anything reads them
    traceback_too = jaxmem.inputs.env_switch("JAXMEM_TRACEBACK")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    with _common.listening():  # the library's notices and compiles, on stderr
      code = args.func(args)
    sys.stdout.flush()  # here, so a closed pipe is caught below rather than at interpreter exit
    return code
  except KeyboardInterrupt:
    # Ctrl-C, in any command: what it had computed is printed (its registered report, see
    # _common.on_interrupt), and the shell's status for SIGINT, 128 + 2; never a traceback.
    try:
      _common.interrupted(args)
      sys.stdout.flush()
    except (KeyboardInterrupt, BrokenPipeError):
      pass
    return 130
  except JaxmemError as e:
    # A failure of the user's own code (a step factory that raised, a step that failed to trace)
    # is chained to its exception; JAXMEM_TRACEBACK=1 prints that traceback above the line.
    if traceback_too:
      traceback.print_exception(e, file=sys.stderr)
      print(f"jaxmem: error: {_common.flag_message(e, parser)}", file=sys.stderr)
    else:
      hint = " (JAXMEM_TRACEBACK=1 prints its traceback)" if e.__cause__ is not None else ""
      print(f"jaxmem: error: {_common.flag_message(e, parser)}{hint}", file=sys.stderr)  # fields named as flags
    return 2
  except SystemExit as e:  # --help, --version
    return e.code if isinstance(e.code, int) else 0
  except BrokenPipeError:
    # The reader went away (`jaxmem ... | head`): Python's documented handling
    # (docs.python.org/3/library/signal.html#note-on-sigpipe): point stdout at devnull so the
    # flush at exit does not fail again, and stop quietly.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
  sys.exit(main())
