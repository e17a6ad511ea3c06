"""Named registries (remat policies, optimizers, weight formats, model presets), one way.

Each registry is a read-only ``Mapping`` from name to entry (so ``REMAT_POLICIES["full"]`` and
``list(OPTIMIZERS)`` work as the dicts they replace did), plus the two lookups every one of them
needs, with the same one-line errors: :meth:`Registry.get` (one name) and :meth:`Registry.parse`
(a comma-separated list, or ``all``). The shape follows optax's ``alias.py``: plain named entries,
looked up by name.

>>> colors = Registry("color", {"red": 1, "green": 2}, field="color")
>>> colors.parse("green,red,green")
(2, 1)
>>> colors.get("blue")
Traceback (most recent call last):
...
jaxmem.errors.JaxmemError: unknown color 'blue'; valid: red, green, all
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Generic, TypeVar

from jaxmem.errors import JaxmemError

T = TypeVar("T")
_MISSING = object()

# The names each kind of entry has, as their owner published them (publish).
_PUBLISHED: dict[str, tuple[str, ...]] = {}


def publish(kind: str, names: Sequence[str]) -> tuple[str, ...]:
  """Makes ``names`` the names of ``kind`` (``"attention"``, ``"context strategy"``): what an
  axis that takes them checks a value against (:func:`jaxmem.axes.registered`), so the models,
  who own the names, publish them here and the axis, declared below the models, reads them
  without importing them. Returns the names, as a tuple."""
  _PUBLISHED[kind] = tuple(names)
  return _PUBLISHED[kind]


def published(kind: str) -> tuple[str, ...]:
  """The names ``kind`` has (:func:`publish`)."""
  try:
    return _PUBLISHED[kind]
  except KeyError:  # a programming error: the owner's module was not imported
    raise LookupError(f"no {kind} names are published; import the module that registers them") from None


class Registry(Mapping[str, T], Generic[T]):
  """Entries by name. ``kind`` names an entry in messages ("remat policy"); ``field`` the
  workload field that takes a list of them ("remat"; ``flag`` is its older name), as errors
  name it (:mod:`jaxmem.errors`); ``in_all`` says which entries
  ``all`` stands for (every entry unless told: aliases, say, are left out)."""

  def __init__(
      self,
      kind: str,
      entries: Mapping[str, T],
      *,
      field: str | None = None,
      flag: str | None = None,
      in_all: Callable[[T], bool] | None = None,
  ):
    self.kind = kind
    self.field = field or flag or kind.split()[-1]
    self._entries = dict(entries)
    self._in_all = in_all

  def __getitem__(self, name: str) -> T:
    return self._entries[name]

  def __iter__(self) -> Iterator[str]:
    return iter(self._entries)

  def __len__(self) -> int:
    return len(self._entries)

  def __repr__(self) -> str:
    return f"Registry({self.kind!r}, {list(self._entries)})"

  def get(self, name: str, default=_MISSING) -> T:  # type: ignore[override]
    """The entry called ``name``; an unknown name is a :class:`JaxmemError` listing the valid
    ones (or ``default``, when one is given, as ``Mapping.get`` would)."""
    try:
      return self._entries[name]
    except KeyError:
      if default is not _MISSING:
        return default
      raise JaxmemError(f"unknown {self.kind} {name!r}; valid: {', '.join(self._entries)}, all") from None

  def parse(self, spec: str | Sequence[str], *, all_filter: Callable[[T], bool] | None = None) -> tuple[T, ...]:
    """``"a,b"`` (or a list of names, each possibly comma-separated) or ``"all"`` to entries,
    in the order given, each once. ``all_filter`` narrows ``all`` further for this call."""
    parts = [spec] if isinstance(spec, str) else list(spec)
    names = [n.strip() for p in parts for n in p.split(",") if n.strip()]
    if not names:
      raise JaxmemError(f"`{self.field}` is empty; give {self.kind} names separated by commas, or all")
    if names == ["all"]:
      keep = lambda e: (self._in_all is None or self._in_all(e)) and (all_filter is None or all_filter(e))  # noqa: E731
      return tuple(e for e in self._entries.values() if keep(e))
    chosen = {n: self.get(n) for n in names}  # a dict keeps the first of repeated names
    return tuple(chosen.values())
