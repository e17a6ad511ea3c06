"""The one exception type for bad input: the CLI prints its message on one line and exits 2.

A message names what was wrong by the library's own name for it, the field of a
:class:`~jaxmem.workload.Workload` or the keyword of an entry point, written in backticks:
``"`microbatches` must be whole numbers of at least 1 (got 0)"``. The library never speaks in
CLI flags; the CLI, which knows its flags, words the message for its users with
:meth:`JaxmemError.worded` (``--microbatches``).

>>> e = JaxmemError("`microbatches` must divide `batch` (got 3)")
>>> e.fields
('microbatches', 'batch')
>>> e.worded({"microbatches": "--microbatches", "batch": "--batch"})
'--microbatches must divide --batch (got 3)'
>>> str(e)
'`microbatches` must divide `batch` (got 3)'
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# A field named in a message: `name`, a Python identifier in backticks.
FIELD = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")


class JaxmemError(ValueError):
  """A user-facing error: what was wrong and how to fix it, in one line, naming the fields at
  fault in backticks (see the module docstring)."""

  @property
  def fields(self) -> tuple[str, ...]:
    """The fields the message names, in order, each once."""
    return tuple(dict.fromkeys(FIELD.findall(str(self))))

  def worded(self, names: Mapping[str, str]) -> str:
    """The message with each field named as ``names`` says (a CLI's flags); a field not in
    ``names`` is written bare."""
    return FIELD.sub(lambda m: names.get(m.group(1), m.group(1)), str(self))


class BadValue(JaxmemError):
  """A value of the wrong type, or outside its range, refused where it enters
  (:mod:`jaxmem.inputs`): ``subject`` is what it was given for, as the message names it (a
  field in backticks, a CLI flag, a config.json field, an environment variable), ``expected``
  what it must be, ``value`` what was given. :meth:`named` is the same refusal for another
  subject (the CLI names the flag a value came in by)."""

  def __init__(self, subject: str, expected: str, value: object):
    self.subject, self.expected, self.value = subject, expected, value
    super().__init__(f"{subject} must be {expected}, got {_shown(value)}")

  def named(self, subject: str) -> BadValue:
    return BadValue(subject, self.expected, self.value)


def _shown(value: object) -> str:
  """A value as a message quotes it: its repr, cut to a line's worth (a whole JSON document
  given where a number belongs must not fill the terminal)."""
  text = repr(value).replace("\n", " ")
  return text if len(text) <= 80 else text[:77] + "..."


class UnknownField(JaxmemError, TypeError):
  """A keyword that names no field of the workload it was given for (``remats=`` for
  ``remat=``). A TypeError too, as Python's own answer to an unknown keyword is."""


class NotAResult(JaxmemError):
  """A file or document given as a saved result that is not one jaxmem wrote (``jaxmem diff``)."""


class NotComparable(JaxmemError):
  """Two saved results that cannot be compared: made by different commands, or holding
  different kinds of record (``jaxmem diff``)."""


class CompilerUnavailable(JaxmemError):
  """A compiler release asked for (``compiler``) cannot be had here: not on the package index for
  this interpreter and machine, or no index reachable (:mod:`jaxmem.compilers`)."""


class DoesNotDivide(JaxmemError):
  """A size that a mesh splits is not a multiple of the split: the workload cannot run on that
  mesh. Its subclass says which size, so a search that tries many meshes counts why each was
  refused by the kind of refusal, not by the words of its message."""


class BatchDoesNotDivide(DoesNotDivide):
  """The global batch is not a multiple of the data axes x (pipeline) microbatches."""


class SeqDoesNotDivide(DoesNotDivide):
  """The sequence is not a multiple of the axes that split it."""


class ExpertsDoNotDivide(DoesNotDivide):
  """The ``expert`` axis does not divide the model's routed experts."""


class StagesRefused(DoesNotDivide):
  """The ``stage`` axis cannot pipeline this model: it does not divide the layers, or the
  schedule or the model's layers cannot be pipelined over it. ``reason``: why, in a few words
  (what a search counts it as)."""

  def __init__(self, message: str, reason: str = "the stage axis cannot pipeline this model's layers"):
    super().__init__(message)
    self.reason = reason


class HeadsDoNotDivide(DoesNotDivide):
  """The ``tensor`` axis does not divide the model's attention heads (or its key/value heads)."""


class DimensionDoesNotDivide(DoesNotDivide):
  """A tensor's dimension is not a multiple of the mesh axes its sharding rules split it over
  (GPT-2's vocabulary of 50257 over ``tensor``, say)."""


class TraceFailed(JaxmemError):
  """A step's own code (a user's factory, MaxText's train step) failed while JAX traced it:
  ``cause`` is that error in a few words (its type and first line)."""

  def __init__(self, message: str, *, cause: str):
    self.cause = cause
    super().__init__(message)


class CompilerRefused(JaxmemError):
  """The compiler refused a program, or jaxmem did not compile it because its arguments alone
  exceed the device: ``required_bytes`` is what the refusal says the program needs (None where it
  says nothing), ``capacity_bytes`` what the target holds, ``out_of_memory`` whether it was for
  memory (a refusal for anything else cannot be explained by the bytes), ``compiled`` whether a
  compile ran (False: the arguments' shapes alone were judged), ``reason`` the compiler's own
  words (the message, where not given apart). A caller that can explain a
  refusal for memory (:mod:`jaxmem.planning.refusal`) tells it from every other error by this
  type."""

  def __init__(self, message: str, *, required_bytes: int | None, capacity_bytes: int | None,
               out_of_memory: bool, compiled: bool, reason: str | None = None):
    super().__init__(message)
    self.reason = message if reason is None else reason
    self.required_bytes, self.capacity_bytes = required_bytes, capacity_bytes
    self.out_of_memory, self.compiled = out_of_memory, compiled
