"""Keep start-up noise from libtpu and the CUDA plugin away from the user.

On a machine without a TPU or without CUDA libraries, importing jax and initialising its
backends makes the plugins write warnings and a Python traceback (``Unable to load CUDA``) to
file descriptor 2 from C++ and from ``logging``. None of it is actionable, and it buries
jaxmem's own output. :func:`quiet` points fd 2 at a temporary file for the duration of a block
and replays what was captured only when the block raised, so genuine failures stay visible.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator

from jaxmem.errors import JaxmemError
from jaxmem.inputs import env_switch


@contextlib.contextmanager
def quiet() -> Iterator[None]:
  """Silences fd 2 (C++ logs and Python warnings alike) within the block."""
  if _verbose():
    yield
    return
  try:
    sys.stderr.flush()
  except (AttributeError, ValueError):
    pass
  try:
    saved = os.dup(2)
  except OSError:  # no fd 2 (embedded interpreters): nothing to silence
    yield
    return
  with tempfile.TemporaryFile(mode="w+b") as sink:
    os.dup2(sink.fileno(), 2)
    failed = False
    try:
      yield
    except BaseException:
      failed = True
      raise
    finally:
      try:
        sys.stderr.flush()
      except (AttributeError, ValueError):
        pass
      os.dup2(saved, 2)
      os.close(saved)
      if failed:
        sink.seek(0)
        captured = sink.read().decode(errors="replace")
        if captured.strip():
          sys.stderr.write(captured)


def _verbose() -> bool:
  """``JAXMEM_VERBOSE`` on: nothing is silenced. Read leniently here, where a refusal would be
  a traceback at ``import jaxmem`` (another word than on or off keeps the noise away); the CLI
  refuses such a value in one line first (:func:`jaxmem.inputs.check_environment`)."""
  try:
    return env_switch("JAXMEM_VERBOSE")
  except JaxmemError:
    return False
