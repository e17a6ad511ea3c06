"""The one call of XLA's compiler in jaxmem: a lowered program compiled, timed, its log kept quiet.

Every command reaches it through :func:`jaxmem.compiler.figures.compile_figures`; the capacity
probes of :mod:`jaxmem.hardware.availability` call it directly (they want the refusal itself,
not figures). Nothing here imports the rest of jaxmem but the quieting of fd 2, so any module
can use it without an import cycle.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import Any

import jax

from jaxmem._quiet import quiet


def compile_timed(
    lowered: jax.stages.Lowered, options: Mapping[str, Any] | None = None, *, quietly: bool = True
) -> tuple[jax.stages.Compiled, float]:
  """The executable and the compile's wall time. ``options`` are XLA compiler options (a dump
  directory, say). ``quietly``: XLA's log lines (the GPU compiler's rematerialization and
  argument-size warnings near the device's memory) are kept off the terminal, and a failed
  compile replays them with its error."""
  start = time.perf_counter()
  with quiet() if quietly else contextlib.nullcontext():
    compiled = lowered.compile(dict(options)) if options else lowered.compile()
  return compiled, time.perf_counter() - start
