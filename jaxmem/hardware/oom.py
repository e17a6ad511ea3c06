"""Reading an out-of-memory message: the bytes it says were required and available.

The TPU compiler refuses a program that does not fit with the figures in its message; the GPU
compiler never fails for size, but its scheduler logs a line when arguments and outputs exceed 80%
of ``device_memory_size`` (the compile still succeeds). The run-time allocators' messages are
known too, for reports of real runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from jaxmem.records import Record

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_SIZE = r"([\d.]+)\s*([KMGTP]?)(?:i?B)?"

# Each pattern gives (required, available); libtpu prints binary units ("128.00G" for 2**37 bytes).
_OOM_PATTERNS = (
    # TPU compile (libtpu 0.0.42): "Ran out of memory on HBM, the total memory required for HLO
    # temporaries (66.79G) exceeds available HBM (15.75G)."
    (re.compile(rf"required for [^()]*\({_SIZE}\) exceeds available \w+ \({_SIZE}\)"), (0, 1)),
    # Older TPU compile: "Ran out of memory in memory space hbm. Used 17.12G of 15.48G hbm."
    (re.compile(rf"Ran out of memory in memory space \w+\.\s*Used {_SIZE} of {_SIZE}"), (0, 1)),
    # TPU run time: "Attempting to allocate 8.00G. That was not possible. There are 5.14G free."
    (re.compile(rf"Attempting to allocate {_SIZE}\..*?There are {_SIZE} free", re.S), (0, 1)),
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
