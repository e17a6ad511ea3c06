"""Records and composed records: ``as_dict()`` in one place, and a record made of parts that is
read, built and written flat.

A leaf (it imports nothing of jaxmem), so that both jaxmem's results (:mod:`jaxmem.records`: rows,
reports) and the models' configurations (:class:`jaxmem.models.ModelConfig`, whose parts are the
model's concerns: attention, feed-forward, windows...) are composed by the same mechanism.

Records hold tuples (notes, shapes, nested records) so they stay immutable; their dict form uses
lists, as JSON does, so ``json.dumps(r.as_dict())`` and a comparison with a row read back from
JSON or the cache agree.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any


def _plain(v: Any) -> Any:
  if isinstance(v, Record):
    return v.as_dict()
  if dataclasses.is_dataclass(v) and not isinstance(v, type):
    return _plain({f.name: getattr(v, f.name) for f in dataclasses.fields(v)})
  if isinstance(v, (tuple, list)):
    return [_plain(x) for x in v]
  if isinstance(v, dict):
    return {k: _plain(x) for k, x in v.items()}
  return v


class Record:
  """Mixin: ``as_dict()`` as plain dicts and lists, nested records included. A field declared
  with ``metadata={"as_dict": False}`` (a live object such as a ``Compiled``) is left out."""

  def as_dict(self) -> dict[str, Any]:
    # Not dataclasses.asdict: it deep-copies every field, which a live object may refuse.
    return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.metadata.get("as_dict", True)}


class Composed(Record):
  """A record made of parts (its fields, each a :class:`Record`), written flat: a row (its
  configuration and figures), a model config (its concerns).

  ``as_dict()`` (so JSON, CSV and the row cache) is the parts' dicts one after another, in the
  order the parts are declared, so a row's keys are its configuration's, then its figures'.
  Reading a part's field on the whole (``row.total_bytes``) reads it from the part that declares
  it; a name two parts declare is refused when the class is first used. The constructor takes
  parts, flat fields, or both (a part given whole, then fields of it replaced), so a row read
  back from its flat dict is ``Row(**d)`` and ``dataclasses.replace(row, fits=False)`` works.
  Declare a subclass with :func:`composed`, which leaves this constructor in place.
  """

  def __init__(self, **fields: Any) -> None:
    cls = type(self)
    kinds = _part_types(cls)
    owner = _flat_names(cls)
    changes: dict[str, dict[str, Any]] = {name: {} for name in kinds}
    given = {name: fields.pop(name) for name in list(fields) if name in kinds}
    for k, v in fields.items():
      if k not in owner:
        raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {k!r}")
      changes[owner[k]][k] = v
    for name, kind in kinds.items():
      part = given.get(name)
      if part is None:
        part = kind(**changes[name])
      elif changes[name]:
        part = dataclasses.replace(part, **changes[name])
      object.__setattr__(self, name, part)
    # A composed record that checks its parts together (a model config's features across its
    # concerns) declares __post_init__, as a plain dataclass would; it runs once the parts are set.
    check = getattr(self, "__post_init__", None)
    if check is not None:
      check()

  def __getattr__(self, name: str) -> Any:
    # Called only for names the record itself lacks: a part's field. Reads the class's table and
    # the part without self's own attribute lookup, so copying and unpickling (which probe
    # attributes before any part is set) get an AttributeError, not a recursion.
    part = _flat_names(type(self)).get(name)
    if part is None:
      raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
    return getattr(object.__getattribute__(self, part), name)

  def as_dict(self) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _part_types(type(self)):
      out.update(getattr(self, name).as_dict())
    return out

  @classmethod
  def flat_fields(cls) -> tuple[str, ...]:
    """The flat keys of this record's ``as_dict()``, in order."""
    return tuple(_flat_names(cls))


def composed(cls: type) -> type:
  """Declares a :class:`Composed` record: a frozen, keyword-only dataclass of parts that keeps
  :class:`Composed`'s flat constructor."""
  return dataclasses.dataclass(frozen=True, kw_only=True, init=False)(cls)


_PARTS: dict[type, dict[str, type]] = {}
_FLAT: dict[type, dict[str, str]] = {}


def _part_types(cls: type) -> dict[str, type]:
  """A composed record's parts: name -> record class, in declaration order."""
  if cls not in _PARTS:
    hints = typing.get_type_hints(cls)
    _PARTS[cls] = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
  return _PARTS[cls]


def _flat_names(cls: type) -> dict[str, str]:
  """A composed record's flat field names -> the part that declares each, in order."""
  if cls not in _FLAT:
    owner: dict[str, str] = {}
    for name, kind in _part_types(cls).items():
      for f in dataclasses.fields(kind):
        if f.name in owner or f.name in _part_types(cls):
          raise TypeError(f"{cls.__name__}: field {f.name!r} is declared by two of its parts")
        owner[f.name] = name
    _FLAT[cls] = owner
  return _FLAT[cls]
