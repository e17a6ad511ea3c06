"""A recommendation written as the command that launches it: the flags of a serving engine's serve
command (vLLM's ``vllm serve``, JetStream's MaxEngine server) or a trainer's overrides (MaxText's).

:class:`Launch` is what a serve command's writer returns: the tool, its argument vector and the
notes that say what it could not spell (MaxText's writer returns its overrides,
:class:`jaxmem.maxtext.emit.MaxTextLaunch`). :class:`Emitter` is one tool's writer, named as
``--emit`` names it, with the kind of result it writes (``takes``), so asking one to write another
command's result is one line, not a wrong launch. Emitters live with what they write (a serving
engine's with the engine, :mod:`jaxmem.inference.engines`; MaxText's with its search,
:mod:`jaxmem.maxtext.search`); :func:`emitters` gathers several layers' into one registry
(``jaxmem.EMITTERS``), so ``--emit NAME`` is dispatched once, whichever command's result it
writes, and :func:`taking` names those a command's result can be written by.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable, Iterable
from typing import Any

from jaxmem.errors import JaxmemError
from jaxmem.records import Record
from jaxmem.registry import Registry


@dataclasses.dataclass(frozen=True, kw_only=True)
class Launch(Record):
  """A command line: ``argv`` as the tool takes it, and ``notes`` on what it leaves to the user
  (a choice the tool has no flag for, a setting it takes elsewhere)."""

  tool: str
  argv: tuple[str, ...]
  notes: tuple[str, ...] = ()

  def text(self) -> str:
    """The command as a shell line (quoted where a word needs it)."""
    return shlex.join(self.argv)


@dataclasses.dataclass(frozen=True)
class Emitter:
  """One tool's launch writer: ``write(result)`` for a result of the kind ``takes`` (a type or a
  tuple of types), ``what`` the words for that kind in the refusal of any other; it returns the
  tool's launch record (a :class:`Launch`, or the tool's own: MaxText's overrides)."""

  name: str
  help: str
  takes: type | tuple[type, ...]
  what: str
  write: Callable[[Any], Any]

  def __call__(self, result: Any) -> Any:
    if not isinstance(result, self.takes):
      raise JaxmemError(f"`emit` {self.name} writes {self.what}; this command's result is not one")
    return self.write(result)


def emitters(*groups: Iterable[Emitter]) -> Registry[Emitter]:
  """The emitters of ``groups`` by name (``--emit``'s choices); a name given twice is an error."""
  out: dict[str, Emitter] = {}
  for e in (e for g in groups for e in g):
    if e.name in out:
      raise JaxmemError(f"two emitters are named {e.name!r}")
    out[e.name] = e
  return Registry("launch", out, field="emit")


def taking(registry: Registry[Emitter], kind: type) -> tuple[str, ...]:
  """The names of ``registry``'s emitters that write a result of ``kind`` (a command's ``--emit``
  choices)."""
  return tuple(name for name, e in registry.items() if issubclass(kind, e.takes))
