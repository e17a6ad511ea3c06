"""The result tables' columns, each declared once: the field it shows, its header, its unit, how
a cell is formatted and when the column is shown.

``compare`` (and ``scale``'s per-point table), ``fit``, ``scale``'s growth exponents, ``plan`` and
``infer`` each have a list of :class:`Column` here (:data:`COMPARE`, :data:`FIT`, :data:`GROWTH`,
:data:`PLAN`, :data:`INFER`); the renderers in :mod:`jaxmem.render.tables`,
:mod:`jaxmem.render.plan` and :mod:`jaxmem.render.inference` lay out whatever the list holds, in
order. A new column is one entry: a field the rows carry and a header, and, where the defaults
do not fit, a formatter, a visibility rule and the cell a refused row shows. The sweep axes'
columns are not entries here: each axis's declaration says how it is shown
(:class:`jaxmem.axes.Shown`), and :func:`axis_columns` makes them for every record that carries
it.

Which columns a table has by default, and which ``--columns`` (the ``columns`` of
:func:`jaxmem.table`) adds, is data too: each column names the sets it belongs to (``sets``:
:data:`DEFAULT`, the first screen's figures that decide a launch; :data:`MEMORY`, :data:`TIME`,
:data:`COMM`), and a column of :data:`CONFIG` (what a row is: the sweep axes' columns, from their
declarations) is in every set. :func:`choose` reads a choice of sets and column names (or
:data:`ALL`) against a table's columns. JSON and CSV carry every field whatever is chosen.

A column's visibility is data, a :class:`Rule`: :data:`ALWAYS`, :data:`VARIES` (its values differ
between the rows), :class:`Some` (some row passes a test: a target with a capacity, several
devices, a pipelined row), :class:`Asked` (a render option such as ``totals``). A missing figure
is ``None`` in the rows and ``-`` in a cell. Tables show bytes in one unit for the whole table
(:mod:`jaxmem.render.units`); CSV and JSON write the rows' own fields, unformatted, plus any
column marked ``written`` (a value derived for the table that the rows do not carry).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from jaxmem.axes import ALWAYS as SHOWN_ALWAYS
from jaxmem.axes import GIVEN, SAID
from jaxmem.axes import VARIES as SHOWN_VARYING
from jaxmem.axes import AXES, Axis
from jaxmem.errors import JaxmemError
from jaxmem.hardware.machine import LINKS
from jaxmem.hardware.margin import AT_RISK, NO, YES
from jaxmem.inference.kv import KV_CACHE_DTYPES
from jaxmem.inference.run import OPTIONS as INFER_OPTIONS
from jaxmem.planning.fit import FitResult
from jaxmem.planning.scale import Growth
from jaxmem.records import Configuration
from jaxmem.render.units import Unit, percent, seconds, unit_for

# The sets a column belongs to (Column.sets), by name as --columns takes them.
CONFIG = "config"  # what a row is (the sweep axes' columns): in every set, so a row can be read
DEFAULT = "default"  # the first screen: the figures that decide a launch
MEMORY = "memory"  # the compiler's byte figures and the verdicts against the capacity
TIME = "time"  # the step-time estimate and what it is made of
COMM = "comm"  # communication: bytes sent and the time it takes on each link
ALL = "all"  # every column (each still shown by its rule)
SETS = (DEFAULT, MEMORY, TIME, COMM, CONFIG)
DEFAULT_CHOICE = frozenset({DEFAULT})
ALL_CHOICE = frozenset({ALL})


@dataclasses.dataclass(frozen=True)
class Table:
  """One table being laid out: its rows, the unit its byte cells are shown in, the render
  options asked (``totals``), the words its headers are filled with (``{unit}``, ``{over}``) and
  ``baseline``, which gives a row the row it is compared with (compare's no-remat row)."""

  rows: Sequence[Any]
  unit: Unit
  options: frozenset[str] = frozenset()
  words: Mapping[str, str] = dataclasses.field(default_factory=dict)
  baseline: Callable[[Any], Any] | None = None
  # The sets and column names chosen (choose()): the table shows the columns they pick.
  chosen: frozenset[str] = dataclasses.field(default_factory=lambda: DEFAULT_CHOICE)

  def picks(self, column: Column) -> bool:
    """Whether the choice takes ``column``: every column with :data:`ALL`, else one of a set
    chosen (:data:`CONFIG` always), or named by its field."""
    return (ALL in self.chosen or bool(column.sets & (self.chosen | {CONFIG})) or column.field in self.chosen
            or (DEFAULT in self.chosen and column.lead is not None and column.lead(column, self)))

  def cells(self) -> list[Cell]:
    """A cell context per row, in order."""
    return [Cell(r, i, None if self.baseline is None else self.baseline(r), self) for i, r in enumerate(self.rows, 1)]


@dataclasses.dataclass(frozen=True)
class Cell:
  """What a column's value and formatter see of one row: the row, its position in the table
  (from 1), the row it is compared with (compare's no-remat row of the same configuration; else
  ``None``) and the table."""

  row: Any
  index: int
  baseline: Any
  table: Table


class Rule(Protocol):
  """When a column is shown, given its table."""

  def __call__(self, column: Column, table: Table) -> bool: ...


@dataclasses.dataclass(frozen=True)
class Always:
  """Every table shows the column."""

  def __call__(self, column: Column, table: Table) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class Varies:
  """Shown when the column's value differs between the rows (one every row shares is not news);
  ``known``: between the rows that have one (``None`` is not a value then)."""

  known: bool = False

  def __call__(self, column: Column, table: Table) -> bool:
    values = {_hashable(column.raw(cell)) for cell in table.cells()}
    return len(values - {None} if self.known else values) > 1


@dataclasses.dataclass(frozen=True)
class Some:
  """Shown when some row passes ``test`` (a row with a capacity, with several devices, ...);
  ``first``: when the first row does."""

  test: Callable[[Any], Any]
  first: bool = False

  def __call__(self, column: Column, table: Table) -> bool:
    rows = table.rows[:1] if self.first else table.rows
    return any(self.test(r) for r in rows)


@dataclasses.dataclass(frozen=True)
class Asked:
  """Shown when the render option ``option`` was asked (``totals``)."""

  option: str

  def __call__(self, column: Column, table: Table) -> bool:
    return self.option in table.options


@dataclasses.dataclass(frozen=True)
class Rows:
  """Shown when ``test`` of the table's rows passes (an axis's own rule, :class:`jaxmem.axes.Shown`)."""

  test: Callable[[Sequence[Any]], bool]

  def __call__(self, column: Column, table: Table) -> bool:
    return bool(table.rows) and self.test(table.rows)


@dataclasses.dataclass(frozen=True)
class Either:
  """Shown when any of ``rules`` shows it."""

  rules: tuple[Rule, ...]

  def __call__(self, column: Column, table: Table) -> bool:
    return any(rule(column, table) for rule in self.rules)


ALWAYS = Always()
VARIES = Varies()
# Bytes in the table's unit; the other units are shown as their formatters write them.
BYTES = "bytes"


def _hashable(v: Any) -> Any:
  return tuple(v) if isinstance(v, list) else v


def text(v: Any, cell: Cell) -> str:
  """The value as it is: ``-`` for ``None``."""
  return "-" if v is None else str(v)


def plain(v: Any, cell: Cell) -> str:
  """A generic cell: ``-`` for ``None``, floats to 4 significant digits, big integers with
  thousands separators, anything else as it is."""
  if v is None:
    return "-"
  if isinstance(v, float):
    return f"{v:.4g}"
  if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10_000:
    return f"{v:,}"
  return str(v)


def size(v: int | None, cell: Cell) -> str:
  """Bytes in the table's unit, two decimals (compare's and fit's tables)."""
  return _size(v, cell.table.unit.size)


def grouped(v: int | None, cell: Cell) -> str:
  """Bytes in the table's unit, two decimals and thousands separated (infer's table)."""
  return cell.table.unit(v)


def secs(v: float | None, cell: Cell) -> str:
  return seconds(v)


def pct(v: float | None, cell: Cell) -> str:
  """A fraction as a percentage."""
  return percent(v)


def signed_pct(v: float | None, cell: Cell) -> str:
  """A percentage already in percent, signed: the recompute overhead."""
  return "-" if v is None else f"{v:+.1f}%"


def general(v: float | None, cell: Cell) -> str:
  """``1.25`` for a factor (``-`` for ``None``)."""
  return "-" if v is None else f"{v:g}"


def _size(v: int | None, unit: float) -> str:
  return "-" if v is None else f"{v / unit:.2f}"


def _delta(v: int | None, base: int | None, unit: float) -> str:
  if v is None or base is None:
    return "-"
  d = (v - base) / unit
  return f"{d:+.2f}" if abs(d) >= 0.005 else "0"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Column:
  """One column of a result table.

  ``field``: the row's field it shows (the CSV key of a ``written`` column). ``header``: its
  header (default: the field, spaced), where ``{unit}`` and the table's other words are filled
  in. ``unit``: :data:`BYTES` for a size (shown in the table's unit, and counted when the unit
  is chosen), else a word for the reader. ``format``: value and cell to text (``-`` for
  ``None``). ``shown``: when the table has the column. ``value``: the cell's value where it is
  not the row's field (from the cell: a delta against the baseline, a figure of a nested row).
  ``refused``: what a refused row (``error`` set) shows instead, where its figure means nothing.
  ``written``: a derived value also written to CSV (a row's own fields always are). ``sets``:
  the sets it belongs to (:data:`DEFAULT`, :data:`MEMORY`, ...; :data:`CONFIG`: every set's).
  ``lead``: when the first screen (:data:`DEFAULT`) takes a column its ``sets`` leave out, given
  the table (the total where no row has a capacity to give ``required``, the peak where the
  backend reports one).
  """

  field: str
  header: str | None = None
  unit: str | None = None
  format: Callable[[Any, Cell], str] = plain
  shown: Rule = ALWAYS
  value: Callable[[Cell], Any] | None = None
  refused: str | None = None
  written: bool = False
  sets: frozenset[str] = frozenset()
  lead: Rule | None = None
  # Among the sweep axes' columns (axis_columns), where this one of the record's own sits.
  place: float | None = None

  def raw(self, cell: Cell) -> Any:
    """The cell's value, unformatted."""
    if self.value is not None:
      return self.value(cell)
    return getattr(cell.row, self.field, None)

  def cell(self, cell: Cell) -> str:
    if self.refused is not None and getattr(cell.row, "error", None):
      return self.refused
    return self.format(self.raw(cell), cell)

  def heading(self, table: Table) -> str:
    header = self.field.replace("_", " ") if self.header is None else self.header
    return header.format(unit=table.unit.name, **table.words)


def shown(columns: Sequence[Column], table: Table) -> list[Column]:
  """The columns ``table`` shows, in order: those its choice picks that their rule shows."""
  return [c for c in columns if table.picks(c) and c.shown(c, table)]


# What a refused row shows in the first of its table's columns that have a refused cell, so the
# row points at its error whichever columns are chosen.
REFUSED_MARK = "error (see below)"


def lay_out(columns: Sequence[Column], table: Table) -> tuple[list[str], list[list[str]]]:
  """The headers and cells of ``table`` under ``columns`` (those it shows)."""
  cols = shown(columns, table)
  mark = next((c for c in cols if c.refused is not None), None)

  def cell(c: Column, cell: Cell) -> str:
    return REFUSED_MARK if c is mark and getattr(cell.row, "error", None) else c.cell(cell)

  return [c.heading(table) for c in cols], [[cell(c, x) for c in cols] for x in table.cells()]


def choose(names: str | Sequence[str] | None, *tables: Sequence[Column]) -> frozenset[str]:
  """A choice of columns for ``tables``: ``names`` a comma list (or a sequence) of sets
  (:data:`SETS`, :data:`ALL`) and the fields of the tables' columns; ``None`` or empty: the
  default. A name no table has is one line naming the valid ones."""
  given = [n.strip() for n in (names.split(",") if isinstance(names, str) else names or ()) if n.strip()]
  if not given:
    return DEFAULT_CHOICE
  sets = [s for s in (ALL, *SETS) if s == ALL or any(s in c.sets for t in tables for c in t)]
  fields = list(dict.fromkeys(c.field for t in tables for c in t))
  for n in given:
    if n not in sets and n not in fields:
      raise JaxmemError(f"`columns`: no column or set {n!r} here; valid: sets {', '.join(sets)}; "
                        f"columns {', '.join(fields)}")
  return frozenset(given)


def written(columns: Sequence[Column], table: Table) -> dict[str, list[Any]]:
  """The values of ``columns`` marked ``written`` (derived for the table, not the rows' own
  fields) for each of ``table``'s rows, by CSV key: what CSV adds after the rows' own fields."""
  cells = table.cells()
  return {c.field: [c.raw(cell) for cell in cells] for c in columns if c.written}


def unit_of(rows: Sequence[Any], fields: Sequence[str]) -> Unit:
  """The unit for a table whose sizes are ``rows``' ``fields``."""
  return unit_for([getattr(r, f, None) for r in rows for f in fields])


def byte_fields(columns: Sequence[Column]) -> tuple[str, ...]:
  """The fields of ``columns`` shown in the table's byte unit (infer chooses its unit from them)."""
  return tuple(c.field for c in columns if c.unit == BYTES and c.value is None)


# --- cells shared by several tables ---


def verdict_cell(r: Any, unit: Unit) -> str:
  """The fits column: ``yes``, ``NO``, or ``at risk`` with the margin left (``-`` without a
  capacity)."""
  if r.verdict is None:
    return "-" if r.fits is None else ("yes" if r.fits else "NO")
  return f"{r.verdict} ({_size(r.margin_bytes, unit.size)} left)" if r.verdict == AT_RISK and r.margin_bytes is not None else r.verdict


def _verdict(r: Any) -> str:
  """The verdict alone: ``yes``, ``NO`` or ``at risk`` (``-`` without a capacity)."""
  return r.verdict or ("-" if r.fits is None else ("yes" if r.fits else "NO"))


def host_verdict_cell(r: Any) -> str:
  """The host fits column: ``yes`` or ``NO`` for a row with host bytes against a known host
  capacity, ``?`` where the host's capacity is unknown (a note says why), ``-`` without host bytes."""
  if not r.host_total_bytes:
    return "-"
  return "?" if r.host_verdict is None else r.host_verdict


def step_time_cells(r: Any) -> list[str]:
  """A row's step-time cells (``-`` where it has none: refused, or no peak figures): the compiled
  schedule simulated, its roofline lower bound, the communication it leaves exposed, the term
  that bounds most of it, and MFU."""
  return [seconds(r.step_time_s), seconds(r.roofline_step_time_s), seconds(r.exposed_comm_time_s), r.bound or "-",
          percent(r.mfu)]


# Marks a comm figure that is a lower bound, not a total (Row.comm_lower_bound).
LOWER_BOUND_MARK = ">="


def _comm(v: int | None, cell: Cell) -> str:
  out = size(v, cell)
  return f"{LOWER_BOUND_MARK}{out}" if cell.row.comm_lower_bound and v is not None else out


def _row_verdict(v: Any, cell: Cell) -> str:
  return verdict_cell(cell.row, cell.table.unit)


def _gflop(v: float | None, cell: Cell) -> str:
  return "-" if v is None else f"{v / 1e9:,.1f}"


def _one_decimal(v: float | None, cell: Cell) -> str:
  return "-" if v is None else f"{v:.1f}"


def _baseline_delta(name: str) -> Callable[[Cell], str]:
  def delta(cell: Cell) -> str:
    b = cell.baseline
    return _delta(getattr(cell.row, name), b and getattr(b, name), cell.table.unit.size)
  return delta


def _over_one(name: str) -> Some:
  return Some(lambda r: (getattr(r, name, None) or 1) > 1)


def _some(name: str) -> Some:
  return Some(lambda r: getattr(r, name, None))


def _known(name: str) -> Some:
  return Some(lambda r: getattr(r, name, None) is not None)


def _crossing(link_field: str) -> Some:
  """A link's time column: shown where some row's collectives crossed slices or hosts (its
  ``fast_link_step_time_s`` is set) and its target has that link."""
  return Some(lambda r: getattr(r, "fast_link_step_time_s", None) and getattr(r, link_field, None) is not None)


def _said(axis: Axis) -> Some:
  return Some(lambda r: (v := getattr(r, axis.name, None)) is not None and v not in axis.quiet)


def axis_rule(axis: Axis, *, summary: bool = False) -> Rule:
  """When a table shows ``axis``'s column, as its declaration says (``summary``: a summary's
  table, which shows the columns that say what its rows are for wherever some row has a value:
  a column of dashes says nothing)."""
  when = axis.column.when
  if when == SHOWN_ALWAYS:
    return ALWAYS
  if summary and axis.column.identity:
    return _known(axis.name)
  if callable(when):
    return Rows(when)
  return {SHOWN_VARYING: VARIES, GIVEN: _known(axis.name), SAID: _said(axis)}[when]


def axis_columns(fields: Sequence[str], *, summary: bool = False, own: Sequence[Column] = ()) -> list[Column]:
  """A column for each sweep axis a record carries under its own name (one of ``fields``), headed
  and shown as its declaration says (:class:`jaxmem.axes.Shown`; ``summary``: see
  :func:`axis_rule`), with the record's ``own`` columns among them by their ``place``, in place
  order. An axis's column says what a row is (:data:`CONFIG`): every choice of columns has it."""
  columns = [Column(field=a.name, header=a.column_header, format=general if a.column.number else text,
                    shown=axis_rule(a, summary=summary), place=a.column.place, sets=_CONFIG)
             for a in AXES.values() if a.column is not None and a.name in fields]
  return sorted([*columns, *own], key=lambda c: c.place)


def swept_columns() -> tuple[str, ...]:
  """The axes with a column where their values differ (the dtypes, the layout's options), beside
  those that say what a row is for: in a recommendation, the words that tell it from the rest."""
  return tuple(a.name for a in AXES.values()
               if a.column is not None and a.column.when == SHOWN_VARYING and not a.column.identity)


def label_fields() -> tuple[str, ...]:
  """The fields that can tell compare's rows apart, in the table's order: the heading's, then
  every axis's by its column's place."""
  return (*HEADING_FIELDS, *(a.name for a in sorted((a for a in AXES.values() if a.column is not None),
                                                     key=lambda a: a.column.place)))


# The shown columns whose values a compare heading does not repeat.
HEADING_FIELDS = ("model", "target", "batch", "seq")
_CONFIGURATION = tuple(f.name for f in dataclasses.fields(Configuration))

PIPELINED = _over_one("stages")
SEVERAL_DEVICES = Some(lambda r: (r.num_devices or 1) > 1)
HAS_CAPACITY = _known("capacity_bytes")
HAS_STEP_TIME = _known("step_time_s")
HOST_BYTES = _some("host_total_bytes")
# No row has a capacity (a CPU target): no `required` to decide a launch by, so the total does.
NO_CAPACITY = Rows(lambda rows: all(getattr(r, "capacity_bytes", None) is None for r in rows))

_CONFIG = frozenset({CONFIG})
_MEMORY = frozenset({MEMORY})
_MEMORY_DEFAULT = frozenset({MEMORY, DEFAULT})
_TIME = frozenset({TIME})
_TIME_DEFAULT = frozenset({TIME, DEFAULT})
_COMM = frozenset({COMM})
_TIME_COMM = frozenset({TIME, COMM})

RUNTIME_AT_RISK = Some(lambda r: getattr(r, "runtime_verdict", None) == AT_RISK)


def runtime_cell(r: Any) -> str:
  """The runtime account's verdict, with the term that decides it where it is at risk."""
  verdict = getattr(r, "runtime_verdict", None)
  if verdict is None:
    return "-"
  return f"{verdict} ({r.runtime_term})" if r.runtime_term else verdict

# compare's table (and scale's per-point table): one row per compiled configuration.
COMPARE: list[Column] = [
    *(Column(field=k, format=text, shown=VARIES, sets=_CONFIG) for k in HEADING_FIELDS),
    # The sweep axes' (a user's step records no attention, microbatches or vocabulary tiles), with
    # the pipeline's stages and bubble among them.
    *axis_columns(_CONFIGURATION, own=(
        Column(field="stages", format=text, shown=PIPELINED, place=85, sets=_CONFIG),
        Column(field="bubble_fraction", header="bubble", format=lambda v, c: "-" if v is None else f"{v:.1%}",
               shown=PIPELINED, place=95, sets=_TIME),
    )),
    Column(field="param_bytes", header="params", unit=BYTES, format=size, sets=_MEMORY),
    Column(field="optimizer_state_bytes", header="opt state", unit=BYTES, format=size, sets=_MEMORY),
    Column(field="argument_size_in_bytes", header="argument", unit=BYTES, format=size, refused="-", sets=_MEMORY),
    Column(field="temp_size_in_bytes", header="temp", unit=BYTES, format=size, refused="-", sets=_MEMORY),
    Column(field="temp_delta", header="Δtemp", format=text, value=_baseline_delta("temp_size_in_bytes"), refused="-",
           sets=_MEMORY),
    # The first screen's memory figures: the peak where the backend reports one (the CPU's does
    # not), the total where no capacity gives `required`.
    Column(field="peak_memory_in_bytes", header="peak", unit=BYTES, format=size, refused="-", sets=_MEMORY,
           lead=_known("peak_memory_in_bytes")),
    Column(field="total_bytes", header="total", unit=BYTES, format=size, refused="-", sets=_MEMORY, lead=NO_CAPACITY),
    Column(field="total_delta", header="Δtotal", format=text, value=_baseline_delta("total_bytes"), refused="-",
           sets=_MEMORY),
    Column(field="flops", header="GFLOP", format=_gflop, sets=_TIME),
    Column(field="recompute_overhead_pct", header="recompute", format=signed_pct, sets=_TIME),
    Column(field="compile_seconds", header="compile s", refused="-",
           format=lambda v, c: "cached" if c.row.cached else _one_decimal(v, c)),
    Column(field="comm_bytes", header="comm", unit=BYTES, format=_comm, shown=SEVERAL_DEVICES, refused="-", sets=_COMM),
    Column(field="host_temp_size_in_bytes", header="host temp", unit=BYTES, format=size,
           shown=_some("host_temp_size_in_bytes"), refused="-", sets=_MEMORY),
    Column(field="host_total_bytes", header="host total", unit=BYTES, format=size, refused="-",
           shown=Some(lambda r: (r.host_total_bytes or 0) != (r.host_temp_size_in_bytes or 0)), sets=_MEMORY),
    # The step-time estimate (jaxmem.records.StepTime), labelled as an estimate: the compiled
    # schedule simulated, its roofline lower bound, the communication it leaves exposed, the term
    # that bounds most of it, and MFU.
    Column(field="step_time_s", header="step (est)", format=secs, shown=HAS_STEP_TIME, sets=_TIME_DEFAULT),
    Column(field="roofline_step_time_s", header="roofline", format=secs, shown=HAS_STEP_TIME, sets=_TIME),
    Column(field="exposed_comm_time_s", header="exposed comm", format=secs, shown=HAS_STEP_TIME, sets=_TIME_COMM),
    # Where collectives cross slices or hosts: each link's simulated time, named by its link, and
    # the step as if every collective ran on the fast one.
    *(Column(field=link.field, header=f"{link.name} comm", format=secs, shown=_crossing(link.field), sets=_TIME_COMM)
      for link in LINKS),
    Column(field="fast_link_step_time_s", header="step, fast link only", format=secs,
           shown=_some("fast_link_step_time_s"), sets=_TIME_COMM),
    Column(field="bound", format=text, shown=HAS_STEP_TIME, sets=_TIME),
    Column(field="mfu", header="MFU (est)", format=pct, shown=HAS_STEP_TIME, sets=_TIME_DEFAULT),
    Column(field="tokens_per_s_per_device", header="tokens/s/device (est)", format=lambda v, c: "-" if v is None else f"{v:,.0f}",
           shown=_known("tokens_per_s_per_device"), sets=_TIME),
    Column(field="capacity_bytes", header="capacity", unit=BYTES, format=size, shown=HAS_CAPACITY, sets=_MEMORY_DEFAULT),
    Column(field="required_bytes", header="required", unit=BYTES, format=size, shown=HAS_CAPACITY, sets=_MEMORY_DEFAULT),
    Column(field="fits", format=_row_verdict, shown=HAS_CAPACITY, sets=_MEMORY_DEFAULT),
    # Offloading: the host's capacity and verdict decide the launch as much as the device's.
    Column(field="host_capacity_bytes", header="host capacity", unit=BYTES, format=size, shown=HOST_BYTES,
           sets=_MEMORY_DEFAULT),
    Column(field="host_verdict", header="host fits", format=lambda v, c: host_verdict_cell(c.row), shown=HOST_BYTES,
           sets=_MEMORY_DEFAULT),
    # The runtime account (jaxmem.hardware.runtime), where it puts some row at risk: its heap, the
    # program's block, what is left once both are placed, and its verdict with the term deciding it
    # (JSON and CSV carry every term with its source). The verdict decides a launch: in the default set.
    Column(field="runtime_heap_bytes", header="heap (runtime)", unit=BYTES, format=size, shown=RUNTIME_AT_RISK,
           sets=_MEMORY),
    Column(field="runtime_program_bytes", header="program block", unit=BYTES, format=size, shown=RUNTIME_AT_RISK,
           sets=_MEMORY),
    Column(field="runtime_available_bytes", header="left (runtime)", unit=BYTES, format=size, shown=RUNTIME_AT_RISK,
           sets=_MEMORY),
    Column(field="runtime_verdict", header="runtime", format=lambda v, c: runtime_cell(c.row), shown=RUNTIME_AT_RISK,
           sets=_MEMORY_DEFAULT),
    Column(field="stage_activation_bytes", header="stage act", unit=BYTES, format=size, shown=PIPELINED, sets=_MEMORY),
    Column(field="required_1f1b_bytes", header="1F1B required (est.)", unit=BYTES, format=size, shown=PIPELINED,
           sets=_MEMORY),
    # --totals: the model's own size and whole-mesh figures (a per-device figure times the devices),
    # in the default set too: they are shown only where asked for.
    *(Column(field=field, header=header, unit=BYTES, format=size, shown=Asked("totals"), sets=_MEMORY_DEFAULT)
      for field, header in (("param_bytes_global", "model params"), ("all_devices_param_bytes", "Σ params"),
                            ("all_devices_optimizer_state_bytes", "Σ opt state"),
                            ("all_devices_argument_bytes", "Σ argument"), ("all_devices_total_bytes", "Σ total"))),
]
# The figures compare's table unit is chosen for.
COMPARE_UNIT_FIELDS = ("total_bytes", "argument_size_in_bytes", "param_bytes")


def _fitted(name: str) -> Callable[[Cell], Any]:
  """A fit answer's figure from its largest fitting row (``None`` without one)."""
  return lambda cell: None if cell.row.row is None else getattr(cell.row.row, name)


def _fitted_size(v: int | None, cell: Cell) -> str | None:
  return None if cell.row.row is None else size(v, cell)


def _fitted_cell(render: Callable[[Any, Cell], str]) -> Callable[[Any, Cell], str]:
  """A cell of a fit answer's row, ``-`` for an answer without one."""
  return lambda v, cell: "-" if cell.row.row is None else render(v, cell)


def _fitted_any(name: str) -> Some:
  return Some(lambda r: r.row is not None and getattr(r.row, name))


def _fitted_step(i: int) -> Callable[[Any, Cell], str]:
  return lambda v, cell: "-" if cell.row.row is None else step_time_cells(cell.row.row)[i]


# fit's table: one answer (the largest fitting workload) per configuration.
# A summary's experts, in a word ("dropless", "capacity 1.25"), where the MoE axes' columns are.
_MOE = Column(field="moe", shown=_some("moe"), place=80, sets=_CONFIG)

FIT: list[Column] = [
    *axis_columns(tuple(f.name for f in dataclasses.fields(FitResult)), summary=True, own=(_MOE,)),
    # The answer: the largest workload that fits, and what it holds against the capacity.
    Column(field="max", header="max {over}", value=lambda c: c.row.max_batch if c.row.over == "batch" else c.row.max_seq,
           sets=_MEMORY_DEFAULT),
    Column(field="required_bytes", header="required {unit}", unit=BYTES, value=_fitted("required_bytes"),
           format=_fitted_cell(size), sets=_MEMORY_DEFAULT),
    # The target's capacity, one figure for the whole table (its note says where it comes from).
    Column(field="capacity_bytes", header="capacity {unit}", unit=BYTES, value=_fitted("capacity_bytes"),
           format=_fitted_cell(size), sets=_MEMORY),
    Column(field="temp_size_in_bytes", header="temp {unit}", unit=BYTES, value=_fitted("temp_size_in_bytes"),
           format=_fitted_cell(size), sets=_MEMORY),
    Column(field="fits", format=_fitted_cell(lambda v, c: verdict_cell(c.row.row, c.table.unit)), sets=_MEMORY_DEFAULT),
    Column(field="host_total_bytes", header="host {unit}", unit=BYTES, value=_fitted("host_total_bytes"),
           format=_fitted_cell(size), shown=_fitted_any("host_total_bytes"), sets=_MEMORY),
    Column(field="host_capacity_bytes", header="host capacity {unit}", unit=BYTES, value=_fitted("host_capacity_bytes"),
           format=_fitted_cell(size), shown=_fitted_any("host_total_bytes"), sets=_MEMORY_DEFAULT),
    Column(field="host_fits", header="host fits", format=_fitted_cell(lambda v, c: host_verdict_cell(c.row.row)),
           shown=_fitted_any("host_total_bytes"), sets=_MEMORY_DEFAULT),
    Column(field="recompute_overhead_pct", header="recompute", value=_fitted("recompute_overhead_pct"), format=signed_pct,
           sets=_TIME),
    Column(field="step_time_s", header="step (est)", format=_fitted_step(0), sets=_TIME_DEFAULT),
    Column(field="roofline_step_time_s", header="roofline", format=_fitted_step(1), sets=_TIME),
    Column(field="exposed_comm_time_s", header="exposed comm", format=_fitted_step(2), sets=_TIME_COMM),
    Column(field="bound", format=_fitted_step(3), sets=_TIME),
    Column(field="mfu", header="MFU (est)", format=_fitted_step(4), sets=_TIME_DEFAULT),
    Column(field="compiles"),
    Column(field="note"),
]
FIT_UNIT_FIELDS = ("required_bytes", "capacity_bytes", "temp_size_in_bytes")


def _component(v: str, cell: Cell) -> str:
  return v.replace("_size_in_bytes", "").replace("_bytes", "").replace("_in", "")


def _exponent(v: float | None, cell: Cell) -> str:
  return "-" if v is None else f"{v + 0.0:.2f}".replace("-0.00", "0.00")


# scale's growth table: one fitted exponent pair per (configuration, component).
GROWTH: list[Column] = [
    *axis_columns(tuple(f.name for f in dataclasses.fields(Growth)), summary=True, own=(_MOE,)),
    Column(field="component", format=_component, sets=_CONFIG),
    # The table's figures, whichever set is chosen (the exponents are all it says).
    Column(field="batch_exponent", format=_exponent, sets=frozenset(SETS)),
    Column(field="seq_exponent", format=_exponent, sets=frozenset(SETS)),
]


def _micro_cell(v: Any, cell: Cell) -> str:
  """The accumulation microbatches, and a pipelined row's pipeline microbatches per each."""
  r = cell.row
  pipe = r.pipeline_microbatches if (r.stages or 1) > 1 else None
  return str(v) + ("" if pipe is None else f" x {pipe} pipelined")


def _against_capacity(v: Any, cell: Cell) -> str:
  r, u = cell.row, cell.table.unit
  return f"{'-' if r.required_bytes is None else u(r.required_bytes)} {u.name} / {with_unit(r.capacity_bytes)}"


def with_unit(v: int | None) -> str:
  """Bytes in their own unit, named: ``16.00 GiB``."""
  if v is None:
    return "-"
  u = unit_for(v)
  return f"{u(v)} {u.name}"


# plan's table: the compiled candidates, ranked.
PLAN: list[Column] = [
    Column(field="rank", header="#", value=lambda c: c.index, format=text, sets=_CONFIG),
    Column(field="mesh", format=text, sets=_CONFIG),
    Column(field="remat", format=text, sets=_CONFIG),
    Column(field="microbatches", format=_micro_cell, sets=_CONFIG),
    Column(field="attention", format=text, sets=_CONFIG),
    Column(field="required_bytes", header="required / capacity", unit=BYTES, format=_against_capacity,
           sets=_MEMORY_DEFAULT),
    # The verdict alone: the margin is the difference of the figures beside it.
    Column(field="fits", format=lambda v, c: _verdict(c.row) if c.row.error is None else "NO (refused)",
           sets=_MEMORY_DEFAULT),
    Column(field="recompute_overhead_pct", header="recompute", format=signed_pct, sets=_TIME),
    Column(field="exposed_comm_time_s", header="exposed comm", format=secs, sets=_TIME_COMM),
    Column(field="step_time_s", header="step (est)", format=secs, sets=_TIME_DEFAULT),
    Column(field="bound", format=text, sets=_TIME),
    # One model, batch and sequence: MFU ranks as the step time does (the recommendation says it).
    Column(field="mfu", header="MFU (est)", format=pct, sets=_TIME),
]
PLAN_UNIT_FIELDS = ("required_bytes",)


def _infer_verdict(v: Any, cell: Cell) -> str:
  # The verdict (yes, at risk, NO: jaxmem.hardware.margin), else whether it fits.
  verdict = cell.row.verdict if cell.row.verdict in (YES, AT_RISK, NO) else None
  return verdict or ("-" if v is None else ("yes" if v else "NO"))


def _three(v: float | None, cell: Cell) -> str:
  return "-" if v is None else f"{v:.3g}"


def _moe(v: Any, cell: Cell) -> str:
  factor = cell.row.capacity_factor
  return (v or "") + ("" if factor is None else f" {factor:g}")


def _against_ridge(v: Any, cell: Cell) -> str:
  ai, ridge = cell.row.arithmetic_intensity, cell.row.ridge_point
  return "-" if ai is None or ridge is None else f"{ai:,.0f} {'>' if ai > ridge else '<'} {ridge:,.0f}"


def _kv_said(r: Any) -> bool:
  # Stored in a dtype other than the compute dtype's default (the dtype axis's quiet values).
  kv = KV_CACHE_DTYPES.get(r.kv_cache_dtype) if r.kv_cache_dtype in KV_CACHE_DTYPES else None
  return r.kv_cache_dtype is not None and (kv is None or kv.dtype not in AXES["dtype"].quiet)


def _infer_bytes(field: str, header: str, sets: frozenset[str] = _MEMORY, lead: Rule | None = None) -> Column:
  return Column(field=field, header=f"{header} {{unit}}", unit=BYTES, format=grouped, sets=sets, lead=lead)


# infer's table: one row per (mesh, weight format, phase, context).
INFER: list[Column] = [
    *(Column(field=k, sets=_CONFIG) for k in ("mesh", "phase", "attention", "weights")),
    # The KV cache's stored dtype where it says something: not the default compute dtype's.
    Column(field="kv_cache_dtype", header="kv dtype", format=text, shown=Some(_kv_said), sets=_CONFIG),
    *(Column(field=k, sets=_CONFIG) for k in ("context", "batch")),
    _infer_bytes("weight_bytes_per_device", "weight_per_device"),
    _infer_bytes("kv_cache_bytes_per_device", "kv_cache_per_device"),
    _infer_bytes("argument_size_in_bytes", "argument"),
    _infer_bytes("temp_size_in_bytes", "temp"),
    # The first screen's memory figures, as compare's.
    _infer_bytes("peak_memory_in_bytes", "peak_memory", lead=_known("peak_memory_in_bytes")),
    _infer_bytes("total_bytes", "total", lead=NO_CAPACITY),
    _infer_bytes("capacity_bytes", "capacity"),  # the target's: one figure for the table, in its note
    Column(field="fits", format=_infer_verdict, sets=_MEMORY_DEFAULT),
    _infer_bytes("weight_bytes", "weight"),
    _infer_bytes("kv_cache_bytes", "kv_cache"),
    Column(field="compile_seconds", header="compile_seconds", format=_three),
    Column(field="attention_kind", header="attention kind"),
    Column(field="kv_cache_bytes_per_token", header="kv/token KiB", format=lambda v, c: "-" if v is None else f"{v / 1024:,.1f}",
           sets=_MEMORY),
    # Prefill's options (decode's are None), where the rows that have one differ in it.
    *(Column(field=a.name, header=a.column_header, format=text, shown=Varies(known=True), sets=_CONFIG)
      for a in INFER_OPTIONS),
    Column(field="moe_impl", header="moe", format=_moe, shown=_some("moe_impl"), sets=_CONFIG),
    # Communication only where there is some to show: several devices, a compiled row.
    Column(field="comm_bytes", header="comm {unit}", format=grouped,
           shown=Some(lambda r: (r.num_devices or 1) > 1 and r.comm_bytes is not None), sets=_COMM),
    Column(field="step_time_s", header="step (est)", format=secs, sets=_TIME_DEFAULT),
    Column(field="bound", format=text, sets=_TIME),
    Column(field="arithmetic_intensity", header="FLOP/B vs ridge", format=_against_ridge, sets=_TIME),
    Column(field="time_per_output_token_s", header="per token (est)", format=secs, sets=_TIME_DEFAULT),
]


def _listed(field: str, sets: frozenset[str] = frozenset()) -> Column:
  """A listing's column (targets, models): headed by its field as the record names it."""
  return Column(field=field, header=field, sets=sets, format=plain)


_DEFAULT = frozenset({DEFAULT})

# `jaxmem targets`: one line per named target (jaxmem.hardware.targets.TargetListing).
TARGETS: list[Column] = [
    _listed("target", _CONFIG),
    *(_listed(k, _DEFAULT) for k in ("platform", "devices", "device_kind")),
    *(_listed(k, _MEMORY_DEFAULT) for k in ("hbm_gib", "capacity_gib")),
    _listed("nvlink_gb_s", _COMM),
    *(_listed(k, _DEFAULT) for k in ("compiler", "note")),
    *(_listed(k, _MEMORY) for k in ("host", "host_ram_gib", "host_gib_per_device", "host_note")),
]

# `jaxmem models`: one line per preset (the records jaxmem.cli.models makes).
MODELS: list[Column] = [
    _listed("model", _CONFIG),
    *(_listed(k, _DEFAULT) for k in ("style", "params", "active_params", "attention", "experts")),
    *(_listed(k) for k in ("top_k", "shared_experts", "expert_d_ff")),
    *(_listed(k, _DEFAULT) for k in ("layers", "d_model", "heads", "kv_heads")),
    *(_listed(k) for k in ("head_dim", "d_ff", "vocab", "tied")),
]


def _loop_hlo(v: Any, cell: Cell) -> str:
  """A buffer's HLO value; one that came out of a loop says which op in the body made it."""
  b = cell.row
  return b.hlo if not b.via_loop else f"{b.hlo} <- {b.via_loop} body {b.producer}"


def _or_dash(v: Any, cell: Cell) -> str:
  return str(v) if v else "-"


# explain's buffers live at the peak (jaxmem.buffers.analyse.PeakBuffer), largest first.
EXPLAIN_BUFFERS: list[Column] = [
    Column(field="size_bytes", header="{unit}", unit=BYTES, format=grouped, sets=_MEMORY_DEFAULT),
    *(Column(field=k, format=text, sets=_CONFIG) for k in ("kind", "dtype", "shape")),
    Column(field="hlo", format=_loop_hlo),
    Column(field="module", format=text, sets=_DEFAULT),
    Column(field="source", format=_or_dash, sets=_DEFAULT),
    # The framework's line each source line called: where asked (explain --framework-frames).
    Column(field="framework", format=_or_dash, shown=Asked("framework"), sets=_DEFAULT),
    Column(field="op_name", header="op_name", format=_or_dash),
]


def _yes_no(v: bool | None, cell: Cell) -> str:
  return "-" if v is None else ("yes" if v else "NO")


_PAGED = Some(lambda r: r.block_size is not None)  # an engine that allocates its cache in blocks (vLLM)


# A serving engine's answer (--engine; jaxmem.inference.engines.EngineCapacity): one row per
# (mesh, weights, context), in the engine's units.
ENGINE: list[Column] = [
    Column(field="mesh"),
    Column(field="weights"),
    Column(field="context"),
    Column(field="max_seqs", header="max seqs"),
    Column(field="fits", format=_yes_no),
    Column(field="block_size", header="block", shown=_PAGED),
    Column(field="num_blocks", header="blocks", shown=_PAGED),
    Column(field="engine_blocks", header="engine blocks", shown=_PAGED),
    Column(field="kv_tokens", header="kv tokens"),
    Column(field="kv_bytes", header="kv {unit}", unit=BYTES, format=grouped),
    Column(field="page_bytes", header="page B", shown=_PAGED),
    Column(field="kernel_page_bytes", header="kernel page B", shown=_PAGED),
    Column(field="max_utilization", header="max util", shown=_PAGED),
    # JetStream's slots a device (MaxText's per_device_batch_size), one of its settings.
    Column(field="per_device_batch_size", value=lambda cell: cell.row.settings.get("per_device_batch_size"),
           shown=Some(lambda r: "per_device_batch_size" in r.settings)),
]

# An engine's terms (jaxmem.inference.engines.base.Term), a device's bytes each.
ENGINE_TERMS: list[Column] = [
    Column(field="name", header="term"),
    Column(field="bytes", header="{unit}", unit=BYTES, format=grouped),
    Column(field="origin", header="from"),
    Column(field="what"),
    Column(field="source"),
]
