"""What tests/test_inputs_properties.py and tests/test_inputs.py share: a run stopped before the
compiler, the CLI run in this process with its exit status and stderr, and the promise every
answer keeps (one line on stderr and exit 2, or a typed error; never a traceback).

:func:`stopped_before_compiling` replaces the one compile call (:mod:`jaxmem.xla` as
:mod:`jaxmem.compiler.figures` and :mod:`jaxmem.hardware.availability` call it) with one that
raises :class:`CompileStarted`, and stops a sweep where it announces its first compile (a
:class:`jaxmem.Compiling` event, sent before the step is traced; infer's program, which it builds
and traces unannounced, where it is built): an input that gets that far was accepted, at the
cost of milliseconds. The capacity and toolkit probes, which compile a tiny program to learn
a TPU's usable memory or whether ptxas knows a GPU, answer without compiling (the datasheet's
memory, a toolkit that works), so a run goes on to check the rest of its input.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

import jaxmem


class CompileStarted(BaseException):
  """A run reached the compiler, or a sweep its first compile: its input was accepted. A
  BaseException, so no ``except Exception`` on the way up mistakes it for a failure."""


def _stop(*args, **kwargs):
  raise CompileStarted


def _stop_at_compiling(event) -> None:
  if isinstance(event, jaxmem.Compiling):
    raise CompileStarted


@contextlib.contextmanager
def stopped_before_compiling(tmp: Path) -> Iterator[pytest.MonkeyPatch]:
  """Within the block nothing compiles (see the module docstring), rows are cached in ``tmp``
  (so none comes from another run's cache), the Hub is read offline from a cache in ``tmp``
  (nothing is fetched), progress is off, and the working directory is ``tmp/cwd`` (where a
  relative output path lands)."""
  from jaxmem.compiler import figures
  from jaxmem.hardware import availability, capacity, gpu
  from jaxmem.inference import run as inference_run

  (tmp / "cwd").mkdir(parents=True, exist_ok=True)
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(figures, "compile_timed", _stop)
    mp.setattr(availability, "compile_timed", _stop)
    mp.setattr(inference_run, "build_infer_program", _stop)  # infer traces before it compiles, unannounced
    mp.setattr(capacity, "_tpu_available_hbm", lambda name: None)  # the datasheet's HBM, no probe
    mp.setattr(gpu, "_gpu_compiles", lambda name: availability.AVAILABLE)
    for name, value in (("JAXMEM_CACHE_DIR", tmp / "cache"), ("HF_HUB_CACHE", tmp / "hub"), ("HF_HUB_OFFLINE", "1"),
                        ("JAXMEM_NO_PROGRESS", "1")):
      mp.setenv(name, str(value))
    for name in ("JAXMEM_TRACEBACK", "JAXMEM_VERBOSE", "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
      mp.delenv(name, raising=False)
    mp.chdir(tmp / "cwd")
    yield mp


@dataclass(frozen=True)
class Ran:
  """A CLI run: its exit status (``None``: stopped at the compiler, so its input was accepted),
  stdout and stderr."""

  code: int | None
  out: str
  err: str

  @property
  def accepted(self) -> bool:
    return self.code is None or self.code == 0


def run_cli(argv: Sequence[str]) -> Ran:
  """``jaxmem ARGV`` through :func:`jaxmem.cli.main`, in this process, with nothing compiled (run
  it inside :func:`stopped_before_compiling`). Any exception but the compile's stop escapes: the
  CLI must never raise."""
  from jaxmem.cli import main

  out, err = io.StringIO(), io.StringIO()
  code: int | None
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), jaxmem.listen(_stop_at_compiling):
    try:
      code = main(list(argv))
    except CompileStarted:
      code = None
  return Ran(code, out.getvalue(), err.getvalue())


def accepted(call: Callable[[], object]) -> bool:
  """Whether ``call()`` (an entry point of the library) got as far as a compile, with nothing
  compiled (inside :func:`stopped_before_compiling`); it returns True too where it finished
  without one. Any exception but the stop escapes."""
  with jaxmem.listen(_stop_at_compiling):
    try:
      call()
    except CompileStarted:
      pass
  return True


def check_promise(ran: Ran, argv: Sequence[str]) -> None:
  """The README's promise: exit 0, 2 or 130 (or stopped at the compiler, accepted); no
  traceback; a refusal is exactly one ``jaxmem: error:`` line on stderr, its last (a status
  line may precede it: the target chosen where none was given)."""
  shown = " ".join(map(repr, argv))
  assert "Traceback" not in ran.err, f"jaxmem {shown}: a traceback\n{ran.err}"
  assert ran.code in (None, 0, 2, 130), f"jaxmem {shown}: exit {ran.code}\n{ran.err}"
  if ran.code == 2:
    lines = ran.err.strip("\n").splitlines()
    errors = [ln for ln in lines if ln.startswith("jaxmem: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], f"jaxmem {shown}: not one error line\n{ran.err}"
    assert all(ln.startswith("jaxmem: ") for ln in lines), f"jaxmem {shown}: stray stderr\n{ran.err}"


def one_line(e: BaseException) -> bool:
  """A typed refusal in one line."""
  return isinstance(e, jaxmem.JaxmemError) and "\n" not in str(e) and str(e).strip() != ""
