"""Every input answered in one line, tried with generated inputs (hypothesis).

Each property feeds one kind of input from outside (a parser's text, a mutated config.json, a
Hub id, a saved result for ``diff``, the environment, a public function's keywords, a command's
whole argument vector) and holds that the answer is a result, or one line: a typed
:class:`~jaxmem.JaxmemError` from the library, ``jaxmem: error: ...`` and exit 2 from the CLI;
never a traceback, never another exit status, never a compile (``no_compile`` stops the run at
the compiler and at the first compile a sweep announces, so an accepted input costs
milliseconds). Where a value is invalid by construction (a count below 1, a field of the wrong
JSON type), it must be refused, not accepted silently.

The default profile runs 200 examples per property (tests/conftest.py); the slow one ten times
as many: ``HYPOTHESIS_PROFILE=slow python -m pytest -n 0 tests/test_inputs_properties.py``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import jaxmem
from jaxmem import inputs
from jaxmem.models import hf

DATA = Path(__file__).parent / "data" / "hf"
CONFIGS = {p.stem: json.loads(p.read_text()) for p in sorted(DATA.glob("*.json"))}


def one_line(e: BaseException) -> bool:
  return isinstance(e, jaxmem.JaxmemError) and "\n" not in str(e) and str(e).strip() != ""


# ----------------------------------------------------------------------------- config.json

# Fields a config.json may carry that change no memory: accepted whatever they hold (hf.py
# says why for each), so a mutation of one is not invalid by construction.
IGNORED = hf._IGNORED | hf._MOE_IGNORED


def _fields_of(doc: dict[str, Any]) -> list[tuple[str, ...]]:
  """The paths of the fields a mutation may change: the top level's, and a multimodal file's
  text model's (``text_config``) and Llama 4's vision tower's."""
  out = [(k,) for k in doc if k not in IGNORED and not (k in hf._MULTIMODAL_IGNORED and "text_config" in doc)]
  if isinstance(doc.get("text_config"), dict):
    out += [("text_config", k) for k in doc["text_config"] if k not in IGNORED and k not in ("architectures", "model_type")]
  if isinstance(doc.get("vision_config"), dict) and doc.get("model_type") == "llama4":  # the fields it is counted from
    out += [("vision_config", k) for k in doc["vision_config"] if k in hf._VISION_COUNTED]
  return out


def _mutations(value: Any) -> st.SearchStrategy[tuple[Any, bool]]:
  """(a changed value, whether it is invalid by construction) for a field holding ``value``: its
  JSON type changed (a number's other numeric type aside: an integer field must refuse 1.5, but
  a number field takes 2), its range (a negative size or scale), its length (a list one longer
  or shorter), or anything at all (which must not crash)."""
  other_types: list[Any] = ["text", [1], {"k": 1}, True, 2]
  if isinstance(value, bool):
    wrong = [0, 1, "true", [value], {}]
  elif isinstance(value, int):
    wrong = [str(value), [value], {}, True]
  elif isinstance(value, float):
    wrong = [str(value), [value], {}, True]
  elif isinstance(value, str):
    wrong = [1, [value], {}, True]
  elif isinstance(value, list):
    wrong = ["x", 1, {}, value[:-1] if value else [1], [*value, value[-1] if value else 1]]
  elif isinstance(value, dict):
    wrong = ["x", 1, [value], True]
  else:  # null: the field's default, whatever its type
    wrong = other_types
  bad = st.sampled_from(wrong).map(lambda v: (v, value is not None))
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    bad = bad | st.sampled_from([-1, -abs(value) - 1, -0.5]).map(lambda v: (v, True))
    bad = bad | st.just((value + 0.5, False))  # an integer field must refuse it, a number field takes it
  anything = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                          lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3),
                          max_leaves=6).map(lambda v: (v, False))
  return st.one_of(bad, anything)


@st.composite
def mutated_config(draw) -> tuple[dict[str, Any], tuple[str, ...], bool]:
  name = draw(st.sampled_from(sorted(CONFIGS)))
  doc = copy.deepcopy(CONFIGS[name])
  path = draw(st.sampled_from(_fields_of(doc)))
  holder = doc if len(path) == 1 else doc[path[0]]
  value, invalid = draw(_mutations(holder[path[-1]]))
  holder[path[-1]] = value
  return doc, (name, *path), invalid


@given(mutated_config())
def test_a_mutated_config_json_is_read_or_refused_in_one_line(case):
  doc, where, invalid = case
  try:
    hf.from_config(doc)
  except jaxmem.JaxmemError as e:
    assert one_line(e), (where, e)
  else:
    assert not invalid, f"{'.'.join(where)} = {_at(doc, where[1:])!r} was accepted"


def _at(doc: dict[str, Any], path: tuple[str, ...]) -> Any:
  for k in path:
    doc = doc[k]
  return doc
