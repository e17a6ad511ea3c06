"""Writing a matplotlib figure where the user asked, or a one-line error naming the path."""

from __future__ import annotations

from typing import Any

from jaxmem.errors import JaxmemError


def save_figure(fig: Any, path: str) -> None:
  """``fig.savefig(path)``; an unwritable path or an unknown extension is one ``JaxmemError``
  naming the ``plot`` field, not matplotlib's traceback."""
  try:
    fig.savefig(path)
  except (OSError, ValueError) as e:
    raise JaxmemError(f"cannot write `plot` {path}: {e}") from None
