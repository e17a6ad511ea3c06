"""``jaxmem diff`` and ``jaxmem.diff``: two saved results compared, as text or JSON.

:func:`diff` takes what a user has at hand (a path to a ``--format json`` file, the loaded
document, an :class:`~jaxmem.Explanation`, or a list of rows) and gives the
:class:`~jaxmem.buffers.diff.ResultDiff`; :func:`render_diff` prints it, each section largest
change first, and says "none" for a section where nothing changed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from jaxmem.buffers.analyse import Explanation
from jaxmem.buffers.diff import ResultDiff, diff_documents
from jaxmem.errors import JaxmemError, NotAResult
from jaxmem.inputs import DIFF, INFERENCE, ROWS, MadeBy, strict_json
from jaxmem.render.explain import explain_json
from jaxmem.render.tables import check_format, envelope, made_by, render_records
from jaxmem.render.units import unit_for
from jaxmem.versions import __version__


def diff(a: Any, b: Any) -> ResultDiff:
  """What changed from result ``a`` to result ``b``: each a path to a file jaxmem wrote with
  ``--format json`` (explain's, or a sweep's rows: compare, fit, scale, infer), the document as
  loaded, a :class:`~jaxmem.Explanation`, or a list of rows. Two results of different commands
  or kinds are a :class:`~jaxmem.NotComparable`, a document that is not a jaxmem result a
  :class:`~jaxmem.NotAResult`. See :mod:`jaxmem.buffers.diff`.

  >>> d = jaxmem.diff("none.json", "full.json")                      # doctest: +SKIP
  >>> [(c.name, c.before) for c in d.saved_disappeared]               # doctest: +SKIP
  [('models/transformer.py:88', 1048576), ...]
  """
  (doc_a, name_a), (doc_b, name_b) = _document(a, "A"), _document(b, "B")
  return diff_documents(doc_a, doc_b, a_name=name_a, b_name=name_b)


def _document(x: Any, which: str) -> tuple[Any, str]:
  """The document ``x`` stands for (a path read as strict JSON, an explanation or rows in hand
  as their JSON would be) and its name in messages; what it holds is checked by the diff
  (:func:`jaxmem.buffers.diff.read_result`)."""
  if isinstance(x, (str, os.PathLike)):
    try:
      with open(x, encoding="utf-8") as f:
        text = f.read()
    except OSError as e:
      raise JaxmemError(f"cannot read {x}: {e.strerror}") from None
    except (UnicodeDecodeError, ValueError):  # not text, or a path with a NUL in it
      raise NotAResult(f"cannot read {x!s}: not a UTF-8 text file; save a result with `format` json") from None
    return strict_json(text, str(x)), str(x)
  if isinstance(x, Explanation):
    return explain_json(x), which
  if isinstance(x, Mapping):
    return x, which
  if isinstance(x, (list, tuple)):
    return envelope(list(x), made_by=MadeBy(command=None, kind=_kind_in_hand(x, which))), which
  raise JaxmemError(f"diff compares saved results (a JSON path, a loaded document, an Explanation or rows), got {type(x).__name__}")


def _kind_in_hand(rows: Sequence[Any], which: str) -> str:
  """The kind of the records in hand (what :func:`jaxmem.compare` or :func:`jaxmem.infer` returned)."""
  from jaxmem.inference.infer import InferRow
  from jaxmem.planning.sweep import Row

  for cls, kind in ((Row, ROWS), (InferRow, INFERENCE), (Mapping, ROWS)):
    if rows and all(isinstance(r, cls) for r in rows):
      return kind
  if not rows:
    return ROWS
  raise JaxmemError(f"{which}: diff compares rows of compare, scale or infer (records of one call), "
                    f"got {', '.join(sorted({type(r).__name__ for r in rows}))}")


def render_diff(d: ResultDiff, fmt: str = "table", *, top: int | None = 20) -> str:
  """The diff in ``fmt``: ``json`` is the whole record; ``table`` and ``markdown`` its sections,
  each listing its ``top`` largest changes (``None``: all) and how many more there are."""
  check_format(fmt)
  if fmt == "json":
    return json.dumps({"made_by": made_by("diff", DIFF).as_dict(), "jaxmem_version": __version__, **d.as_dict()}, indent=2)
  if fmt == "csv":
    raise JaxmemError("diff writes table, markdown or json (its sections are several tables)")
  figures = [v for group in (d.figures, d.consumers, d.kinds, d.sources, d.ops) for c in group for v in (c.before, c.after)]
  figures += [v for b in d.buffers for v in (b.before_bytes, b.after_bytes)]
  figures += [v for r in d.rows for c in r.figures for v in (c.before, c.after)]
  u = unit_for(figures, smallest="KiB")
  out = [f"A: {d.a}", f"B: {d.b}"]
  out += [f"versions: {k} {a or '-'} -> {b or '-'}" for k, (a, b) in d.versions.items()] or ["versions: the same"]
  if d.kind == "rows":
    out += _rows(d, u, fmt, top)
  else:
    out += _explain(d, u, fmt, top)
  out += [f"note: {n}" for n in d.notes]
  return "\n".join(out).rstrip()


def _changes(title: str, changes: Sequence[Any], u: Any, fmt: str, what: str = "name", top: int | None = None,
             none: str = "none differ") -> list[str]:
  if not changes:
    return ["", f"{title}: {none}"]
  rows = [{what: c.name, f"A {u.name}": u(c.before), f"B {u.name}": u(c.after), f"Δ {u.name}": _signed(u, c.delta_bytes)}
          for c in changes[:top]]
  return ["", f"{title}:", render_records(rows, fmt)] + _more(changes, top)


def _more(changes: Sequence[Any], top: int | None) -> list[str]:
  left = len(changes) - (top if top is not None else len(changes))
  return [f"... and {left} more (--top, or --format json for all)"] if left > 0 else []


def _signed(u: Any, v: int) -> str:
  return ("+" if v > 0 else "") + u(v)


def _explain(d: ResultDiff, u: Any, fmt: str, top: int | None) -> list[str]:
  out = [f"configuration: {k} {a} -> {b}" for k, (a, b) in d.configuration_changes.items()] or ["configuration: the same"]
  out += _changes("figures", d.figures, u, fmt, "figure")
  out += _changes("consumers", d.consumers, u, fmt, "consumer")
  out += _changes("live at the peak by kind", d.kinds, u, fmt, "kind")
  if d.buffers:
    rows = [{"kind": b.kind, "dtype": b.dtype, "shape": b.shape, "source": b.source or "-", "op": b.op or "-",
             "A n": b.before_count, "B n": b.after_count, f"A {u.name}": u(b.before_bytes), f"B {u.name}": u(b.after_bytes),
             f"Δ {u.name}": _signed(u, b.delta_bytes)} for b in d.buffers[:top]]
    out += ["", "buffers live at the peak whose sizes differ (alike buffers grouped, n of each):", render_records(rows, fmt)]
    out += _more(d.buffers, top)
  else:
    out += ["", "buffers live at the peak whose sizes differ: none"]
  out += _changes("live at the peak by source line", d.sources, u, fmt, "source", top)
  out += _changes("live at the peak by op", d.ops, u, fmt, "op", top)
  out += _changes("saved activations that disappear (saved residuals live at A's peak, none at B's), by source line",
                  d.saved_disappeared, u, fmt, "source", none="none")
  out += _changes("saved activations that appear (none at A's peak), by source line", d.saved_appeared, u, fmt, "source",
                  none="none")
  return out


def _rows(d: ResultDiff, u: Any, fmt: str, top: int | None) -> list[str]:
  """Each row's changes, the ``top`` largest first (the rows come ordered so)."""
  out = []
  for r in d.rows[:top]:
    config = ", ".join(f"{k} {v}" for k, v in r.configuration.items() if k in _SHOWN and v is not None)
    out += ["", f"{r.status}: {config}"]
    out += [f"  configuration: {k} {a} -> {b}" for k, (a, b) in r.configuration_changes.items()]
    out += [f"  {k}: {a} -> {b}" for k, (a, b) in r.outcomes.items()]
    if r.status in ("matched", "paired"):
      out += _changes("  figures", r.figures, u, fmt, "figure")[1:]
  if not d.rows:
    out.append("rows: none in either document")
  return out + _more(d.rows, top)


# The configuration fields a row's heading names.
_SHOWN = ("model", "target", "mesh", "remat", "optimizer", "batch", "seq", "attention", "microbatches")

