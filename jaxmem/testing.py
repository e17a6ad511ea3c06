"""Memory gates for a team's own tests: a step's compiled memory checked in CI, before a slice.

>>> import jax, jax.numpy as jnp
>>> from jaxmem.testing import assert_fits, assert_memory_below
>>> def step(w, x):
...   return jax.grad(lambda w: jnp.tanh(x @ w).sum())(w)
>>> w = jax.ShapeDtypeStruct((1024, 1024), jnp.float32)
>>> x = jax.ShapeDtypeStruct((256, 1024), jnp.float32)
>>> report = assert_memory_below(step, w, x, limit="64MiB")   # compiled here, for the CPU
>>> report.argument_size_in_bytes
5242880

:func:`assert_fits` compiles a step for a target (``tpu:v5p-8``, ``gpu:h100x8``; a TPU or GPU
target needs its compiler installed, not the device) and fails, as a pytest assertion, unless
it fits with a margin to spare; :func:`assert_memory_below` holds the compiler's figure under a
fixed limit on any target, the CPU included (there it is the CPU compiler's allocation, which
overstates an accelerator's). Both give back the :class:`~jaxmem.MemoryReport`, for further
checks of your own, as :func:`jaxmem.analyze` gives it (a target by name resolved as the CLI
resolves ``--target``, the verdict and notes its). A compile the backend refuses for anything but
memory raises as :func:`jaxmem.analyze` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jaxmem.compiler.analysis import lower_for_target
from jaxmem.compiler.figures import Figures
from jaxmem.compiler.report import MemoryReport, Refusal
from jaxmem.hardware.targets import Target, resolved_target
from jaxmem.errors import BadValue, JaxmemError
from jaxmem.inputs import Number, Size


def assert_fits(
    step: Callable, *args: Any, target: str | Target, margin: float | int | str = 0, resident: int | str = 0,
    **jit_kwargs: Any,
) -> MemoryReport:
  """Compiles ``jax.jit(step, **jit_kwargs)`` for ``args`` on ``target`` (as :func:`jaxmem.analyze`)
  and fails unless what must fit (``required_bytes``: the compiler's peak, at most the total)
  leaves ``margin`` of the capacity free: a float below 1 is a fraction of the capacity
  (``0.1``: 10% to spare), an int or a string a size (``"2GiB"``). ``resident``: bytes another
  program holds on each device (``"14.5GiB"``), out of the capacity, with a TPU compile capped to
  match, whether ``target`` is a name or a :class:`~jaxmem.Target`. A TPU compiler's own
  out-of-memory refusal fails the same way. Returns the report. A bad argument (no target, a
  ``None`` margin) is a :class:`~jaxmem.JaxmemError`, before anything compiles."""
  if target is None:
    raise BadValue("`target`", "a target with a capacity (a name such as tpu:v5p-8 or gpu:h100x8, or a Target)", target)
  spare_of = _margin(margin)
  tgt = resolved_target(target, resident=Size()(resident, "`resident`"))
  if tgt.capacity_bytes is None:
    raise JaxmemError(f"assert_fits needs a target with a capacity ({tgt.name} has none); "
                      "use assert_memory_below(..., limit=...) on the CPU")
  spare = spare_of(tgt.capacity_bytes)
  outcome = _compile(step, args, tgt, jit_kwargs)
  limit = tgt.capacity_bytes - spare
  figures = outcome if isinstance(outcome, Figures) else None
  required = outcome.required_bytes
  if figures is None or required is None or required > limit:
    raise AssertionError(_failure(outcome, tgt, limit, spare, what="capacity"))
  return figures.judged_report()


def assert_memory_below(
    step: Callable, *args: Any, limit: int | str, target: str | Target | None = "cpu", **jit_kwargs: Any
) -> MemoryReport:
  """Compiles ``step`` for ``args`` on ``target`` (default the CPU; ``None``: where ``jax.jit``
  puts it) and fails unless what must fit (``required_bytes``) is at most ``limit`` bytes per
  device (an int, or ``"512MiB"``; ``None`` is refused, not read as 0 bytes). Returns the report."""
  cap = Size()(limit, "`limit`")
  outcome = _compile(step, args, target, jit_kwargs)
  required = outcome.required_bytes
  if not isinstance(outcome, Figures) or required is None or required > cap:
    name = target if isinstance(target, str) or target is None else target.name
    raise AssertionError(_failure(outcome, name, cap, 0, what="limit"))
  return outcome.judged_report()


def _compile(step: Callable, args: tuple, target: Any, jit_kwargs: dict[str, Any]) -> Figures | Refusal:
  outcome = lower_for_target(step, *args, target=target, **jit_kwargs).figures()
  if isinstance(outcome, Refusal) and outcome.fits is not False:  # not a refusal for memory
    raise outcome.cause if outcome.cause is not None else JaxmemError(outcome.error)
  return outcome


def _margin(margin: float | int | str) -> Callable[[int], int]:
  """The bytes to keep free of a capacity: a fraction of it (a float in [0, 1)), or a size."""
  if isinstance(margin, float):
    fraction = Number(least=0.0, below=1.0)(margin, "`margin` as a fraction of the capacity")
    return lambda capacity: int(capacity * fraction)
  spare = Size()(margin, "`margin`")
  return lambda capacity: spare


def _failure(outcome: Figures | Refusal, target: Any, limit: int, spare: int, *, what: str) -> str:
  name = getattr(target, "name", target)
  required = outcome.required_bytes
  if isinstance(outcome, Refusal):
    need = "" if required is None else f" ({required / 2**30:.2f} GiB per device)"
    return f"the compiler refused the step for {name}{need}: {outcome.error}"
  r = outcome.report
  what_is = f"its {what} less a margin of {spare / 2**30:.2f} GiB" if spare else f"its {what}"
  parts = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in (("argument", r.argument_size_in_bytes),
                    ("output", r.output_size_in_bytes), ("temp", r.temp_size_in_bytes)) if v is not None)
  return (f"the step needs {(required or 0) / 2**30:.3f} GiB per device on {name}, over {what_is} "
          f"({limit / 2**30:.3f} GiB); GiB: {parts}")


def _main(argv: list[str]) -> int:
  """``python -m jaxmem.testing``: this module is a library for a team's tests, not a command;
  say so in one line (exit 2) rather than run, ignore the arguments and succeed."""
  import sys

  given = f" (got {' '.join(argv)})" if argv else ""
  print(f"jaxmem.testing: error: a library for your tests (assert_fits, assert_memory_below in a pytest test), "
        f"not a command{given}; for the command line run `jaxmem --help`", file=sys.stderr)
  return 2


if __name__ == "__main__":
  import sys

  sys.exit(_main(sys.argv[1:]))
