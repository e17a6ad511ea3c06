"""The serving-engine flags ``infer`` and ``fit --phase`` share: ``--engine`` (a serving engine's
capacity rule, :func:`jaxmem.engine_capacity`), its settings, ``--kv-cache-dtype`` and ``--emit``
(the engine's serve command for the answer, through the one ``--emit`` registry,
:func:`jaxmem.emitters`)."""

from __future__ import annotations

import argparse
import dataclasses

import jaxmem
from jaxmem import inputs
from jaxmem.cli import _common as c
from jaxmem.render import tables
from jaxmem.render.inference import render_engine

# The launch writers --emit names for an engine's answer (jaxmem.EMITTERS, the one registry).
EMITTERS = jaxmem.taking(jaxmem.EMITTERS, jaxmem.EngineCapacity)
# Each engine setting's flag field (jaxmem.EngineSettings' fields, each with its flag's help).
SETTINGS = tuple(f.name for f in dataclasses.fields(jaxmem.EngineSettings))
# Each setting's parser (jaxmem.inputs): a share of the device is a fraction, the rest counts.
_TYPES = {"gpu_memory_utilization": inputs.Fraction()}


def add_engine(p: argparse.ArgumentParser) -> None:
  """``--engine``, its settings (one flag each field of :class:`jaxmem.EngineSettings`),
  ``--kv-cache-dtype`` and ``--emit``."""
  p.add_argument(
      "--engine", default=None, type=inputs.Choice(tuple(jaxmem.ENGINES)),
      help=f"a serving engine's own capacity rule ({', '.join(jaxmem.ENGINES)}): its KV budget, blocks and the "
      "concurrent sequences x context that fit, from the compiled weights and forward pass",
  )
  p.add_argument("--kv-cache-dtype", default=None, type=inputs.Choice(tuple(jaxmem.KV_CACHE_DTYPES)),
                 help=f"how the KV cache stores keys and values: {', '.join(jaxmem.KV_CACHE_DTYPES)}; default the "
                 "compute dtype")
  for f in dataclasses.fields(jaxmem.EngineSettings):
    p.add_argument("--" + f.name.replace("_", "-"), type=_TYPES.get(f.name, inputs.Whole()), default=None,
                   help=f"--engine {f.metadata['engine']}: {f.metadata['help']}")
  # Not a choice of this command's writers: run_engine names what another command's writer writes.
  p.add_argument("--emit", default=None,
                 help=f"with --engine: also write the serve command for the answer ({', '.join(EMITTERS)}); "
                 "in JSON as `launches`")


def check_engine(args: argparse.Namespace) -> None:
  """One line for an engine flag without ``--engine`` (``--kv-cache-dtype`` stands alone)."""
  if args.engine is not None:
    return
  for name in (*SETTINGS, "emit"):
    if getattr(args, name) is not None:
      raise jaxmem.JaxmemError(f"`{name}` is a serving engine's: give `engine` ({', '.join(jaxmem.ENGINES)})")


def run_engine(args: argparse.Namespace, chosen: str | None, *, batch: int | None, refused: dict[str, object]) -> int:
  """The engine's answer (one per mesh, weights and context), and ``--emit``'s launch for each
  that fits. ``refused``: this command's flags an engine has no use for, given (each one line)."""
  tables.check_format(args.format)
  for name, value in refused.items():
    if value:
      raise jaxmem.JaxmemError(f"`{name}` does not apply with `engine` {args.engine}: it compiles the engine's own "
                               "programs (its settings set them)")
  if args.emit and args.format == "csv":
    raise jaxmem.JaxmemError("`emit` writes after the table or into JSON; use `format` table, markdown or json with it")
  emitter = None if args.emit is None else jaxmem.EMITTERS.get(args.emit)
  if emitter is not None and args.emit not in EMITTERS:  # another command's writer: one line before any compile
    raise jaxmem.JaxmemError(f"`emit` {args.emit} writes {emitter.what}; an engine's answer is written by "
                             f"{', '.join(EMITTERS)}")
  jaxmem.ENGINES.get(args.engine)  # a bad name is one line before anything starts
  if emitter is not None and args.emit in jaxmem.ENGINES and args.emit != args.engine:
    raise jaxmem.JaxmemError(f"`emit` {args.emit} writes engine {args.emit}'s launch; this answer is engine "
                             f"{args.engine}'s (give `emit` {args.engine})")
  w = c.workload(args, jaxmem.InferWorkload)
  settings = {name: getattr(args, name) for name in SETTINGS}
  results = c.Sweep(args, chosen, cached=False).run(lambda run: jaxmem.engine_capacity(
      w, engine=args.engine, batch=batch, context=args.context, run=run, **settings,
  ))
  launches = []
  if emitter is not None:
    fitting = [r for r in results if r.fits]
    if not fitting:
      c.say(f"jaxmem: nothing fits, so there is no {args.emit} launch to write")
    launches = [emitter(r) for r in fitting]
  c.emit(render_engine(results, args.format, launches=launches), args.output)
  return 0
