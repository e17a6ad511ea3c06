"""``as_dict()`` for jaxmem's frozen result dataclasses, in one place.

Results hold tuples (notes, shapes, nested records) so they stay hashable and immutable; their
dict form uses lists, as JSON does, so ``json.dumps(r.as_dict())`` and a comparison with a row
read back from JSON or the cache agree.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def _plain(v: Any) -> Any:
  if isinstance(v, (tuple, list)):
    return [_plain(x) for x in v]
  if isinstance(v, dict):
    return {k: _plain(x) for k, x in v.items()}
  return v


class Record:
  """Mixin: ``as_dict()`` as plain dicts and lists (``dataclasses.asdict`` already recurses
  into nested dataclasses)."""

  def as_dict(self) -> dict[str, Any]:
    return _plain(dataclasses.asdict(self))
