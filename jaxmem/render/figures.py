"""Writing a matplotlib figure where the user asked, or a one-line error naming the path; and
the file formats a figure can be written in, known before anything is drawn."""

from __future__ import annotations

import functools
from typing import Any

from jaxmem.errors import JaxmemError


@functools.cache
def plot_formats() -> tuple[str, ...]:
  """The file extensions matplotlib writes a figure in (its canvas's own list: png, pdf, svg,
  ...), what a plot's path must end in. Read once, when first asked (matplotlib is slow to
  import)."""
  from matplotlib.backend_bases import FigureCanvasBase

  return tuple(sorted(FigureCanvasBase.get_supported_filetypes()))


def save_figure(fig: Any, path: str) -> None:
  """``fig.savefig(path)``; an unwritable path or an unknown extension is one ``JaxmemError``
  naming the ``plot`` field, not matplotlib's traceback."""
  try:
    fig.savefig(path)
  except (OSError, ValueError) as e:
    raise JaxmemError(f"cannot write `plot` {path}: {e}") from None
