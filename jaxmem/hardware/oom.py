"""Reading an out-of-memory message: the bytes it says were required and available.

The TPU compiler refuses a program that does not fit with the figures in its message; the GPU
compiler never fails for size, but its scheduler logs a line when arguments and outputs exceed 80%
of ``device_memory_size`` (the compile still succeeds). The run-time allocators' messages are
known too, for reports of real runs.

Beyond the two totals, :func:`parse_hbm_account` reads the accounting a TPU out-of-memory report
prints (the compiler's "Total hbm usage" and "Program hbm requirement", the runtime's "HBM
capacity" with its "Top-of-Memory reserved", "Currently allocated" and "Program requirement",
and a program load's "free" and "reservable" bytes), for :mod:`jaxmem.hardware.runtime` to be
held to published reports (tests/data/oom_reports).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from jaxmem.records import Record

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_SIZE = r"(-?[\d.]+)\s*([KMGTP]?)(?:i?B)?"

# Each pattern gives (required, available); libtpu prints binary units ("128.00G" for 2**37 bytes).
_OOM_PATTERNS = (
    # TPU compile (libtpu 0.0.42): "Ran out of memory on HBM, the total memory required for HLO
    # temporaries (66.79G) exceeds available HBM (15.75G)."
    (re.compile(rf"required for [^()]*\({_SIZE}\) exceeds available \w+ \({_SIZE}\)"), (0, 1)),
    # Older TPU compile: "Ran out of memory in memory space hbm. Used 17.12G of 15.48G hbm."
    (re.compile(rf"Ran out of memory in memory space \w+\.\s*Used {_SIZE} of {_SIZE}"), (0, 1)),
    # TPU run time: "Attempting to allocate 8.00G. That was not possible. There are 5.14G free."
    # Loading a program: "Attempting to reserve 6.48G at the bottom of memory. That was not possible.
    # There are 6.78G free, 0B reserved, and 3.33G reservable." (openxla/xla docs/errors/error_0101.md)
    (re.compile(rf"Attempting to (?:allocate|reserve) {_SIZE}[. ].*?There are {_SIZE} free", re.S), (0, 1)),
    # GPU compile (a log line, the compile succeeds): "The byte size of input/output arguments
    # (274878955520) exceeds the base limit (67954383257)."
    (re.compile(r"byte size of input/output arguments \((\d+)()\) exceeds the base limit "
                r"\((\d+)()\)"), (0, 1)),
    # GPU run time (BFC allocator): "Out of memory while trying to allocate 123456 bytes."
    (re.compile(rf"[Oo]ut of memory (?:while trying to allocate|allocating) {_SIZE}"), (0, None)),
)


def _bytes(number: str, unit: str) -> int:
  return int(round(float(number) * _UNITS[unit.upper()]))


@dataclass(frozen=True, kw_only=True)
class OutOfMemory(Record):
  """What an out-of-memory message says: the bytes required and available (either may be
  ``None`` where the message does not give it)."""

  required_bytes: int | None
  available_bytes: int | None


def parse_oom(message: str) -> OutOfMemory | None:
  """The required and available bytes from an out-of-memory error text.

  Knows the TPU compile-time and run-time messages and the GPU scheduler's log line and run-time
  allocator message; None when `message` is not an out-of-memory report.
  """
  for pattern, (req, avail) in _OOM_PATTERNS:
    m = pattern.search(message)
    if m:
      groups = m.groups()
      required = _bytes(groups[2 * req], groups[2 * req + 1])
      available = None if avail is None else _bytes(groups[2 * avail], groups[2 * avail + 1])
      return OutOfMemory(required_bytes=required, available_bytes=available)
  if "RESOURCE_EXHAUSTED" in message and "memory" in message.lower():
    return OutOfMemory(required_bytes=None, available_bytes=None)
  return None


# The sections of a TPU out-of-memory report (the compiler's and the runtime's: see
# tests/data/oom_reports): each a heading and indented "name  size" lines under it.
_SECTIONS = {
    "total": re.compile(r"Total hbm usage >= "),
    "program": re.compile(r"Program hbm requirement"),
    "persistent": re.compile(r"Persistent allocations"),
    "heap": re.compile(r"Heap allocator status"),
    "capacity": re.compile(r"HBM capacity "),
}
_LINE = re.compile(rf"^\s*([A-Za-z][A-Za-z /()-]*?):?\s+{_SIZE}(?:\s*\(\s*(-?[\d,]+) bytes\))?")
_USED = re.compile(rf"Used {_SIZE} of {_SIZE} hbm")
_LOAD = re.compile(rf"Attempting to reserve {_SIZE} at the bottom of memory.*?There are {_SIZE} free, {_SIZE} reserved, "
                   rf"and {_SIZE} reservable", re.S)
_OUTPUT = re.compile(rf"Output size {_SIZE}(?: \([^)]*\))?; shares {_SIZE} with arguments")


@dataclass(frozen=True, kw_only=True)
class ProgramLoad(Record):
  """A TPU runtime's failure to load a program (openxla/xla docs/errors/error_0101.md): the
  contiguous block it tried to reserve at the bottom of memory, the free bytes, the bytes other
  loaded programs reserved, and the bytes reservable (free and contiguous at the bottom)."""

  request_bytes: int
  free_bytes: int
  reserved_bytes: int
  reservable_bytes: int


@dataclass(frozen=True, kw_only=True)
class HbmAccount(Record):
  """The accounting a TPU out-of-memory report prints, each figure ``None`` where the report
  does not print it. ``capacity_bytes``: the HBM it counts against (the runtime's "HBM
  capacity"; the compiler's "Used U of C"); ``top_reserved_bytes``: the top of memory the runtime
  reserves (infeed, outfeed, continuations); ``heap_bytes``: the buffers allocated ("Currently
  allocated"); ``program_bytes``: the program's block ("Program requirement"; the compiler's
  "program"); ``available_after_bytes``: what the runtime says is left once the program is
  placed; ``program_parts``: the program block's lines (global, scoped, HLO temp...). Exact where
  the report prints bytes, else its rounded figure."""

  capacity_bytes: int | None = None
  used_bytes: int | None = None
  total_bytes: int | None = None
  top_reserved_bytes: int | None = None
  heap_bytes: int | None = None
  program_bytes: int | None = None
  available_after_bytes: int | None = None
  arguments_bytes: int | None = None
  output_bytes: int | None = None
  output_shared_bytes: int | None = None
  max_free_chunk_bytes: int | None = None
  program_parts: dict[str, int] = field(default_factory=dict)
  load: ProgramLoad | None = None


def _sections(text: str) -> dict[str, dict[str, int]]:
  """Each section's lines, name -> bytes (the exact bytes where printed), in the order printed."""
  out: dict[str, dict[str, int]] = {}
  current = None
  for line in text.splitlines():
    head = next((k for k, pat in _SECTIONS.items() if pat.search(line)), None)
    if head is not None:
      current = out.setdefault(head, {})
      if head in ("total", "capacity"):
        m = re.search(rf"(?:>=|capacity) {_SIZE}", line)
        current["_heading"] = _bytes(*m.groups()) if m else None
      continue
    m = _LINE.match(line)
    if current is None or m is None or not line.startswith(" "):
      continue
    name = m.group(1).strip().split("(")[0].strip().lower()
    exact = m.group(4)
    current[name] = int(exact.replace(",", "")) if exact else _bytes(m.group(2), m.group(3))
  return out


def parse_hbm_account(text: str) -> HbmAccount | None:
  """The accounting a TPU out-of-memory report prints (see :class:`HbmAccount`), or ``None``
  where ``text`` prints none of it."""
  sec = _sections(text)
  total, program = sec.get("total", {}), sec.get("program", {})
  capacity, persistent = sec.get("capacity", {}), sec.get("persistent", {})
  used, load, output = _USED.search(text), _LOAD.search(text), _OUTPUT.search(text)
  if not (sec or used or load):
    return None
  args = total.get("arguments", persistent.get("arguments"))
  loaded = None
  if load:
    g = load.groups()
    loaded = ProgramLoad(request_bytes=_bytes(g[0], g[1]), free_bytes=_bytes(g[2], g[3]),
                         reserved_bytes=_bytes(g[4], g[5]), reservable_bytes=_bytes(g[6], g[7]))
  return HbmAccount(
      capacity_bytes=capacity.get("_heading") if capacity else (_bytes(*used.groups()[2:]) if used else None),
      used_bytes=_bytes(*used.groups()[:2]) if used else None,
      total_bytes=total.get("_heading"),
      top_reserved_bytes=capacity.get("top-of-memory reserved", total.get("reserved")),
      heap_bytes=capacity.get("currently allocated", total.get("heap allocations")),
      program_bytes=capacity.get("program requirement", total.get("program")),
      available_after_bytes=capacity.get("available after request"),
      arguments_bytes=args,
      output_bytes=_bytes(*output.groups()[:2]) if output else persistent.get("output"),
      output_shared_bytes=_bytes(*output.groups()[2:]) if output else None,
      max_free_chunk_bytes=sec.get("heap", {}).get("max free chunk"),
      program_parts={k: v for k, v in program.items() if not k.startswith("_")},
      load=loaded,
  )
