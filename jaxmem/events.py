"""What the library tells whoever is listening while it works: a compile about to start, and
notices (a cache entry that did not read back, say). The library never prints; the CLI listens
and prints (:func:`listen`), and a program of yours may do the same.

>>> seen = []
>>> with listen(seen.append):
...   notice("something worth a line")
>>> seen
[Notice(text='something worth a line', progress=False)]

Without a listener a :class:`Notice` is a :class:`JaxmemWarning` (Python's ``warnings``, so
it can be filtered) and a :class:`Compiling` event goes nowhere.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import warnings
from collections.abc import Callable, Iterator
from typing import Any


class JaxmemWarning(UserWarning):
  """A notice nobody listened for (see :func:`listen`)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Compiling:
  """A configuration is about to be traced and compiled: the ``index``-th (from 1) of ``total``
  in one run of a sweep (``total`` None where a search does not know it), described by ``label``."""

  index: int
  total: int | None
  label: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Notice:
  """A line worth telling the user that is neither a result nor an error. A ``progress`` notice
  (what a search expects to do) is dropped where nobody listens; any other becomes a warning."""

  text: str
  progress: bool = False


Event = Compiling | Notice
_LISTENERS: contextvars.ContextVar[tuple[Callable[[Any], None], ...]] = contextvars.ContextVar(
    "jaxmem_listeners", default=()
)


@contextlib.contextmanager
def listen(callback: Callable[[Event], None]) -> Iterator[None]:
  """Within the block, ``callback`` receives every :class:`Compiling` and :class:`Notice`."""
  token = _LISTENERS.set(_LISTENERS.get() + (callback,))
  try:
    yield
  finally:
    _LISTENERS.reset(token)


def emit(event: Event) -> None:
  """Tells the listeners; a notice without one becomes a :class:`JaxmemWarning`."""
  listeners = _LISTENERS.get()
  for callback in listeners:
    callback(event)
  if not listeners and isinstance(event, Notice) and not event.progress:
    warnings.warn(event.text, JaxmemWarning, stacklevel=3)


def notice(text: str, *, progress: bool = False) -> None:
  """:func:`emit` of a :class:`Notice`."""
  emit(Notice(text=text, progress=progress))
