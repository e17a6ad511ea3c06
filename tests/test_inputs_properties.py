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
as many: ``JAXMEM_HYPOTHESIS_PROFILE=slow python -m pytest -n 0 tests/test_inputs_properties.py``.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given
from hypothesis import strategies as st
from inputs_harness import accepted, check_promise, one_line, run_cli, stopped_before_compiling

import jaxmem
from jaxmem import AXES, inputs
from jaxmem.cli import build_parser
from jaxmem.models import hf
from jaxmem.registry import published

DATA = Path(__file__).parent / "data" / "hf"
CONFIGS = {p.stem: json.loads(p.read_text()) for p in sorted(DATA.glob("*.json"))}


@pytest.fixture(scope="module", autouse=True)
def no_compile(tmp_path_factory):
  """Every property here runs with nothing compiled (inputs_harness.stopped_before_compiling)."""
  with stopped_before_compiling(tmp_path_factory.mktemp("inputs")) as mp:
    yield mp


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


# ----------------------------------------------------------------------------- the parsers

# Text that is no number at all, and numbers written as Python's float() takes them but a count
# or a size does not (a fraction, an exponent, Unicode digits, an underscore).
JUNK = st.sampled_from(["", " ", "x", "1.5", "1e3", "0x10", "nan", "inf", "-inf", "-", "+", "1_000", "١٢", "½", "1 2",
                        "8GiB", "None", "[1]", "{}", "true", "0\x1f", "1\u2003", "\t2\n"]) | st.text(max_size=12)


def _is_whole(text: str) -> bool:
  t = text.strip(" \t\r\n")
  return t.lstrip("+-").isascii() and t.lstrip("+-").isdigit() and t.count("-") + t.count("+") <= 1 and t[:1] in "+-0123456789" and len(t) <= 31


@st.composite
def whole_texts(draw, parser: inputs.Whole) -> tuple[str, bool]:
  """(text, whether ``parser`` must refuse it)."""
  lo = parser.least if parser.least is not None else -(10**9)
  hi = parser.most if parser.most is not None else 10**12
  kind = draw(st.sampled_from(["in", "below", "junk"] + (["above"] if parser.most is not None else [])))
  if kind == "in":
    n = draw(st.integers(lo, hi))
    return draw(st.sampled_from([str(n), f" {n} ", f"+{n}" if n >= 0 else str(n)])), False
  if kind == "below" and parser.least is not None:
    return str(draw(st.integers(max_value=parser.least - 1))), True
  if kind == "above":
    return str(draw(st.integers(min_value=parser.most + 1))), True
  text = draw(JUNK)
  return text, not _is_whole(text) or not lo <= int(text) <= hi


PARSERS_USED = [inputs.Whole(), inputs.Whole(least=0)]


@pytest.mark.parametrize("parser", PARSERS_USED, ids=repr)
@given(data=st.data())
def test_a_whole_number_is_parsed_or_refused(parser, data):
  text, invalid = data.draw(whole_texts(parser))
  try:
    n = parser(text)
  except jaxmem.BadValue as e:
    assert one_line(e) and invalid, (text, e)
  else:
    assert not invalid and isinstance(n, int) and n == int(text) and n >= parser.least, text


def _number_or_none(text: str) -> float | None:
  try:
    x = float(text)
  except ValueError:
    return None
  return x if math.isfinite(x) else None


NUMBER_TEXTS = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.integers(-10, 10).map(str), JUNK,
                         st.floats(-2, 2).map(lambda x: f"{x:g}"))


@pytest.mark.parametrize("parser", [inputs.Fraction(), inputs.Number(above=0.0), inputs.Number(least=0.0, below=1.0)],
                         ids=repr)
@given(text=NUMBER_TEXTS)
def test_a_number_is_parsed_or_refused(parser, text):
  x = _number_or_none(text)
  ok = x is not None and all((parser.above is None or x > parser.above, parser.least is None or x >= parser.least,
                              parser.most is None or x <= parser.most, parser.below is None or x < parser.below))
  try:
    got = parser(text)
  except jaxmem.BadValue as e:
    assert one_line(e) and not ok, (text, e)
  else:
    assert ok and got == x, text


SIZES = st.one_of(
    st.tuples(st.integers(0, 4096), st.sampled_from(["", "B", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "TB", "gib"]))
    .map(lambda t: (f"{t[0]}{t[1]}", True)),
    st.tuples(st.floats(0, 64).map(lambda x: f"{x:.2f}"), st.sampled_from(["GiB", "MiB"])).map(lambda t: ("".join(t), True)),
    st.sampled_from(["-1", "-1GiB", "1x", "GiB", "1.2.3GiB", "", " ", "1 0GiB", "nan", "1e3GiB", "None"]).map(lambda t: (t, False)),
)


@given(case=SIZES)
def test_a_size_is_parsed_or_refused(case):
  text, valid = case
  try:
    n = inputs.Size()(text)
  except jaxmem.BadValue as e:
    assert one_line(e) and not valid, (text, e)
  else:
    assert valid and isinstance(n, int) and n >= 0, text


CHOICES = inputs.Choice(("table", "markdown", "json", "csv"))
LISTED = inputs.Choice(("bf16", "fp8", "int8"), listed=True, every=True)


@pytest.mark.parametrize("parser", [CHOICES, LISTED], ids=repr)
@given(data=st.data())
def test_a_choice_is_parsed_or_refused(parser, data):
  names = st.sampled_from([*parser.values, "all", "", "x", "JSON", "table ", " csv"])
  if parser.listed:
    value = data.draw(st.one_of(st.lists(names, max_size=4).map(",".join), st.lists(names, max_size=3), st.text(max_size=8)))
  else:
    value = data.draw(st.one_of(names, st.text(max_size=8), st.integers(), st.none()))
  parts = [value] if isinstance(value, str) else value if isinstance(value, list) else None
  words = None if parts is None else [n.strip() for p in parts for n in p.split(",") if n.strip()]
  ok = (words is not None and (words == ["all"] and parser.every or (bool(words) and all(w in parser.values for w in words)))
        if parser.listed else isinstance(value, str) and value.strip() in parser.values)
  try:
    got = parser(value)
  except jaxmem.BadValue as e:
    assert one_line(e) and not ok, (value, e)
  else:
    assert ok, value
    assert got in parser.values if not parser.listed else set(got) <= set(parser.values)


@given(text=st.one_of(st.sampled_from(["1", "0", "true", "False", "YES", "no", "on", "OFF", "", " 1 ", "2", "maybe", "y"]),
                      st.text(max_size=6)))
def test_a_switch_is_on_off_or_refused(text):
  word = text.strip().lower()
  try:
    on = inputs.Switch()(text, "JAXMEM_NO_PROGRESS")
  except jaxmem.BadValue as e:
    assert one_line(e) and word not in ("1", "true", "yes", "on", "", "0", "false", "no", "off")
  else:
    assert on == (word in ("1", "true", "yes", "on")) and word in ("1", "true", "yes", "on", "", "0", "false", "no", "off")


@pytest.mark.parametrize("parser", [inputs.ADDRESS, inputs.STEP], ids=["address", "step"])
@given(text=st.one_of(st.text(max_size=20), st.sampled_from(["tcp://host:8786", "host:8786", "tls://h:1", "mod:make_step",
                                                              "a/b.py:make", ":x", "x:", "tcp://", "a b:c", "\x00:x"])))
def test_an_address_or_a_step_is_text_of_its_pattern_or_refused(parser, text):
  try:
    got = parser(text)
  except jaxmem.BadValue as e:
    assert one_line(e)
  else:
    assert got == text.strip() and got and "\x00" not in got and "\n" not in got


OVERRIDES = st.one_of(st.text(max_size=12), st.sampled_from(["a=b", "a=", "=b", "a", "per_device_batch_size=4", "a.b=c",
                                                             "1a=2", "a b=c", "a=b=c"]))


@given(config=st.one_of(st.sampled_from(["base.yml", "", "a=b", "x\x00"]), st.text(max_size=8)),
       overrides=st.lists(OVERRIDES, max_size=3), joined=st.booleans())
def test_maxtext_arguments_are_a_config_and_key_value_overrides_or_refused(config, overrides, joined):
  value: Any = " ".join([config, *overrides]) if joined else [config, *overrides]
  try:
    got = inputs.maxtext_args(value)
  except jaxmem.JaxmemError as e:
    assert one_line(e)
  else:
    assert "=" not in got[0] and got[0].strip()
    assert all(inputs.override(p)[0] for p in got[1:])
    if not joined:  # given as a list, every override must have been a key=value
      assert all("=" in p and p.split("=")[0].isidentifier() or "." in p.split("=")[0] for p in overrides)


# ----------------------------------------------------------------------------- the environment

SWITCH_WORDS = st.sampled_from(["1", "0", "true", "off", "", "2", "maybe", "yes please", "ON"]) | st.text(max_size=4)


@given(name=st.sampled_from([*inputs.SWITCHES, "HF_HUB_OFFLINE"]), value=SWITCH_WORDS)
def test_a_variable_of_jaxmems_is_read_or_refused_in_one_line_before_anything_runs(no_compile, name, value):
  value = value.replace("\x00", "")
  valid = value.strip().lower() in ("1", "true", "yes", "on", "", "0", "false", "no", "off")
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv(name, value)
    if name == "HF_HUB_OFFLINE":
      argv = ["estimate", "--model", "Org-X/Model-Y"]  # a Hub id: the variable is read
    else:
      argv = ["estimate", "--model", "tiny"]
    ran = run_cli(argv)
  check_promise(ran, argv)
  if not valid:
    assert ran.code == 2 and name in ran.err, (name, value, ran.err)
  elif name != "HF_HUB_OFFLINE":
    assert ran.code == 0, (name, value, ran.err)


@given(value=NUMBER_TEXTS, old=st.booleans())
def test_the_gpu_allocators_fraction_is_read_or_refused_in_one_line(no_compile, value, old):
  name = inputs.MEM_FRACTION_VARIABLES[old]
  value = value.replace("\x00", "")
  x = _number_or_none(value)
  valid = x is not None and 0 < x <= 1 or not value.strip()
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv(name, value)
    argv = ["compare", "--model", "tiny", "--target", "gpu:h100", "--batch", "2", "--seq", "16"]
    ran = run_cli(argv)
  check_promise(ran, argv)
  assert (ran.code == 2) == (not valid), (name, value, ran.err)


# ----------------------------------------------------------------------------- Hub ids

HUB_IDS = st.one_of(
    st.text(max_size=30),
    st.tuples(st.text("abcXYZ019-_.~$ /@", min_size=1, max_size=12), st.text("abcXYZ019-_.~$ @", min_size=1, max_size=40),
              st.one_of(st.none(), st.text("abc019-_./~ ", max_size=10)))
    .map(lambda t: f"{t[0]}/{t[1]}" + ("" if t[2] is None else f"@{t[2]}")),
    st.sampled_from(["a/b--c", "a/b..c", "a/b.git", "a/" + "x" * 97, "-a/b", "a/b-", "google/gemma-3-27b-it", "a/b@main",
                     "a/b@", "a/b@x..y", "org/name@v1.0", "a/b/c", "tiny", "", " ", "a/ b"]),
)


@given(name=HUB_IDS)
def test_a_hub_id_is_checked_before_the_hub_client_is_called(no_compile, name):
  """Every string given as a model: a preset, a path, or a Hub id the client's own validator
  accepts (then read offline here, so it is not cached: one line); one the validator refuses
  never reaches the client."""
  import huggingface_hub
  from huggingface_hub.utils import HFValidationError, validate_repo_id

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(huggingface_hub, "hf_hub_download", _hub_called)
    try:
      jaxmem.load_model(name)
    except _HubCalled:
      repo = name.strip().split("@")[0]  # a model name is read without its surrounding spaces
      validate_repo_id(repo)  # reached the client: the validator must accept the id
    except jaxmem.JaxmemError as e:
      assert one_line(e), (name, e)
    except HFValidationError as e:  # pragma: no cover - the failure this test is for
      raise AssertionError(f"{name!r}: the Hub client's validator raised past jaxmem: {e}") from None


class _HubCalled(Exception):
  pass


def _hub_called(*args, **kwargs):
  raise _HubCalled


# ----------------------------------------------------------------------------- saved results for diff


def _row(**fields: Any) -> dict[str, Any]:
  base = dict(model="tiny", target="cpu", mesh="fsdp=1", batch=2, num_devices=1, remat="none", optimizer="adamw", seq=64,
              param_dtype="float32", dtype="bfloat16", temp_size_in_bytes=100, total_bytes=300, required_bytes=300, fits=None)
  return {**base, **fields}


def _made(command: str | None, kind: str) -> dict[str, Any]:
  return {"command": command, "version": jaxmem.__version__, "kind": kind}


EXPLAIN_DOC = {
    "made_by": _made("explain", inputs.EXPLANATION), "consumers": {"parameters": 100, "activations": 50},
    "peak_bytes": 150, "compiler_bytes": 160, "live_bytes_at_peak": 140, "by_kind": {"parameter": 100},
    "configuration": {"remat": "none"}, "versions": {"jax": "0.12.0.1"},
    "live_set": [{"kind": "parameter", "dtype": "f32", "shape": "f32[8,8]", "source": "a.py:1", "op": "dot", "module": "m",
                  "count": 2, "size_bytes": 512}],
    "peak_buffer_details": [{"kind": "parameter", "dtype": "f32", "shape": "f32[8,8]", "source": "a.py:1",
                             "op_name": "jit(f)/dot", "module": "m", "size_bytes": 256}],
}
ROWS_DOC = {"made_by": _made("compare", inputs.ROWS), "versions": {}, "rows": [_row(), _row(remat="full", total_bytes=250)]}
INFER_DOC = {"made_by": _made("infer", inputs.INFERENCE), "rows": [_row(phase="decode", weights="bf16")]}
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3), max_leaves=10)


@st.composite
def saved_documents(draw) -> tuple[Any, bool]:
  """(a document given to diff, whether it must be refused): arbitrary JSON, or a result of
  jaxmem's with one field replaced by arbitrary JSON (its made_by, its rows or a row, a field
  the explain diff reads), or a result whose rows are not objects."""
  how = draw(st.sampled_from(["any", "field", "row", "not objects", "as is"]))
  base = copy.deepcopy(draw(st.sampled_from([EXPLAIN_DOC, ROWS_DOC, INFER_DOC])))
  if how == "any":
    return draw(JSON_VALUES), False
  if how == "field":
    key = draw(st.sampled_from(sorted(base) + ["made_by", "rows", "consumers"]))
    base[key] = draw(JSON_VALUES)
    return base, False
  if how == "row" and base.get("rows"):
    base["rows"][0][draw(st.sampled_from(sorted(base["rows"][0])))] = draw(JSON_VALUES)
    return base, False
  if how == "not objects" and "rows" in base:  # explain's document has none to read
    base["rows"] = [*base["rows"], draw(st.one_of(st.integers(), st.text(max_size=3), st.lists(st.integers(), max_size=2)))]
    return base, True
  return base, False


@given(a=saved_documents(), b=saved_documents())
def test_diff_of_any_json_is_a_diff_or_one_line(a, b):
  (doc_a, bad_a), (doc_b, bad_b) = a, b
  try:
    d = jaxmem.diff(doc_a, doc_b)
  except jaxmem.JaxmemError as e:
    assert one_line(e), e
  else:
    assert not (bad_a or bad_b), "rows that are not objects were diffed"
    made = [doc.get("made_by") if isinstance(doc, dict) else None for doc in (doc_a, doc_b)]
    if all(isinstance(m, dict) and isinstance(m.get("kind"), str) for m in made):
      commands = [m.get("command") for m in made]
      assert made[0]["kind"] == made[1]["kind"] and (None in commands or commands[0] == commands[1]), made
    for fmt in ("table", "json"):
      jaxmem.table(d, fmt)


@given(a=saved_documents(), text=st.one_of(st.just(None), st.sampled_from(["", "{", "NaN", '{"rows": [NaN]}', "[1, 2]", "\x00"]),
                                           st.binary(max_size=8)))
def test_the_diff_command_on_any_file_exits_0_or_2_with_one_line(no_compile, tmp_path_factory, a, text):
  d = tmp_path_factory.mktemp("diff")
  pa, pb = d / "a.json", d / "b.json"
  pa.write_text(json.dumps(a[0]))
  if text is None:
    pb.write_text(json.dumps(a[0]))
  elif isinstance(text, bytes):
    pb.write_bytes(text)
  else:
    pb.write_text(text)
  argv = ["diff", str(pa), str(pb)]
  ran = run_cli(argv)
  check_promise(ran, argv)
  if a[1]:
    assert ran.code == 2


# ----------------------------------------------------------------------------- every command's flags

# Values for the flags whose text the library reads (no type= of their own): a few it takes, a
# few it refuses, and any text. A path is one in the run's own folder, or one that cannot be
# written; a step factory one of the tests' or none that can be imported (never a generated
# import path: the CLI imports what --step names).
PATHS = st.sampled_from(["out.json", "out.png", "out.svg", "out.txt", "sub/out.json", "nodir/x/out.json", "/proc/out.json", ".",
                         "xprof-dir", ""])
STEPS = st.sampled_from(["test_api_parity:make_attention_step", "no_such_module_jaxmem:make_step", "json:loads", ":x",
                         "tests/none.py:make_step", "x"])
FREE: dict[str, st.SearchStrategy[str]] = {
    "model": st.sampled_from(["tiny", "tiny-moe", "tiny-mla", "gpt2-small", str(DATA / "tiny-qwen2.json"),
                              str(DATA / "tiny-gemma4.json"), "no-such-model", "Org-X/Model-Y", "a/b--c", "x.json", "", "tiny,tiny"]),
    "target": st.sampled_from(["cpu", "cpu:2", "cpu:0", "cpu:x", "tpu:v5e-4", "tpu:v5p-8", "gpu:h100", "gpu:h100x8", "gpu:a100x3",
                               "attached", "tpu:v9-1", "gpu:zz", "", "cpu:-1", "tpu:v5e-4@x"]),
    "remat": st.sampled_from(["none", "full", "dots_saveable", "none,full", "all", "search", "names:save=a", "custom:x=y", "bogus", "",
                              ","]),
    "optimizer": st.sampled_from(["adamw", "sgd,adamw", "all", "bogus", "", "lion"]),
    "weights": st.sampled_from(["bf16", "int8,fp8", "all", "q3", "", "int4"]),
    "phase": st.sampled_from(["prefill", "decode", "prefill,decode", "both", ""]),
    "context": st.sampled_from(["2048", "64,128", "0", "-1", "x", "", "64"]),
    "over": st.sampled_from(["batch", "seq", "context", "width", "", "seq=32,64", "batch=2,4", "seq=", "x=1", "seq=0", "seq=a"]),
    "kind": st.sampled_from(["parameter", "residual,gradient", "saved residual", "bogus", "", ","]),
    "framework_packages": st.sampled_from(["", "mypkg", "a,b", " , ", "jax"]),
    "precision": st.sampled_from(["mixed", "fp32", "bf16", "fp8", ""]),
    "recompute": st.sampled_from(["none", "selective", "full", "some"]),
    "param_dtype": st.sampled_from(["float32", "bfloat16", "int8", "", "none"]),
    "output": PATHS, "plot": PATHS, "xprof": PATHS,
    "emit": st.sampled_from(["maxtext", "bogus"]),
    "columns": st.sampled_from(["all", "memory", "default,time", "bogus", "", ",", "peak_bytes"]),
}
# Each axis flag's values: some of its own kind (published names where it takes a registry's)
# and some it must refuse at parse time (INVALID, by the axis's parser).
AXIS_VALUES = ["1", "2,4", "0.1", "1.25", "none", "on", "off", "float32", "bfloat16", "bfloat16,float32", "data=2", "fsdp=2,tensor=2"]
INVALID: dict[str, list[str]] = {
    "mesh": ["data=x", "bogus=2", "data=0", "", "data=2,data=2", "data"],
    "moe_impl": ["bogus"], "capacity_factor": ["0", "-1", "inf", "x"], "moe_kernel": ["bogus", ""],
    "param_dtype": [], "dtype": [], "attention": ["bogus", ""], "dropout": ["1", "-0.1", "nan", "x"],
    "microbatches": ["0", "-1", "x", ""], "vocab_tiles": ["0", "x"], "context_strategy": ["bogus"],
    "sequence_parallel": ["maybe", "2"], "fsdp_shard_on_exp": ["maybe", "2"], "pipeline_microbatches": ["0", "x"], "pipeline_repeats": ["0", "-2", "x"],
    "qk_dtype": ["float16", "", "x"], "compiler": ["jax==0.1", "libtpu", "libtpu==", "bogus==1"], "quantization": ["bogus", "fp8"], "master_dtype": [], "moments_dtype": [], "grad_reduce_dtype": [],
}


def _flag_values(action: argparse.Action) -> st.SearchStrategy[tuple[str, bool]]:
  """(a value for ``action``'s flag, whether its parser must refuse it), drawn from the flag's
  parser: a whole number's, a number's, a size's, a choice's, an axis's; the rest's from FREE."""
  t, name = action.type, action.dest
  if isinstance(t, inputs.Whole):
    return whole_texts(t).map(lambda c: (c[0], c[1]))
  if isinstance(t, inputs.Number):
    return NUMBER_TEXTS.map(lambda x: (x, _number_or_none(x) is None or not _in_range(t, _number_or_none(x))))
  if isinstance(t, inputs.Size):
    return SIZES.map(lambda c: (c[0], not c[1]))
  if isinstance(t, inputs.Choice):
    return st.sampled_from([*t.values, "bogus", ""]).map(lambda v: (v, v not in t.values))
  if t is inputs.ADDRESS:
    return st.sampled_from([("tcp://127.0.0.1:1", False), ("a b", True), ("", True), ("tcp://", True)])
  if t is inputs.STEP:
    return STEPS.map(lambda v: (v, v in (":x", "x")))
  if type(t).__name__ == "FlagValue":
    axis = AXES[t.axis]
    valid = list(published(axis.valid)) if axis.valid else AXIS_VALUES
    return st.one_of(st.sampled_from(valid).map(lambda v: (v, False)),
                     st.sampled_from(INVALID[axis.name] or ["x"]).map(lambda v: (v, bool(INVALID[axis.name]))),
                     st.text(max_size=6).map(lambda v: (v, False)))
  if name in FREE:
    return FREE[name].map(lambda v: (v, False))
  raise AssertionError(f"no values for {action.option_strings or action.dest}: give its parser a strategy here")


def _in_range(t: inputs.Number, x: float) -> bool:
  return all((t.above is None or x > t.above, t.least is None or x >= t.least, t.most is None or x <= t.most,
              t.below is None or x < t.below))


def _commands() -> dict[str, argparse.ArgumentParser]:
  sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
  return dict(sub.choices)


COMMANDS = _commands()


def test_every_flag_of_every_command_has_values_to_try():
  """A new flag needs a parser with a strategy here (or values in FREE): none is left untried."""
  for command, p in COMMANDS.items():
    for action in p._actions:
      if action.option_strings and action.nargs != 0 and action.dest not in ("help", "maxtext"):
        _flag_values(action)
  assert set(INVALID) == set(AXES) - {"remat", "optimizer"}  # the axes with a flag of add_axes


@st.composite
def argument_vectors(draw, command: str) -> tuple[list[str], bool]:
  """(a whole argument vector of ``command``, whether a value in it is invalid by construction):
  up to six of its flags with generated values, the switches among them alone; ``--model tiny``
  and ``--target cpu`` unless drawn (so most runs are cheap), the positional results of diff."""
  p = COMMANDS[command]
  flags = [a for a in p._actions if a.option_strings and a.dest != "help"]
  chosen = draw(st.lists(st.sampled_from(flags), max_size=6, unique_by=lambda a: a.dest)) if flags else []
  argv, invalid = [command], False
  given = {a.dest for a in chosen}
  for default, value in (("model", "tiny"), ("target", "cpu")):
    if default not in given and any(a.dest == default for a in flags) and draw(st.booleans()):
      argv += [f"--{default}", value]
  for a in chosen:
    flag = max(a.option_strings, key=len)
    if a.nargs == 0:
      argv.append(flag)
    elif a.dest == "maxtext":
      argv += [flag, *draw(st.lists(OVERRIDES, min_size=1, max_size=3))]
    else:
      value, bad = draw(_flag_values(a))
      argv.append(f"{flag}={value}")  # = keeps a value that starts with - a value
      invalid |= bad
  if command == "diff":
    argv += [draw(st.sampled_from(["a.json", "b.json", "missing.json", "."])) for _ in range(2)]
  return argv, invalid


@pytest.fixture(scope="module")
def saved_results(no_compile):
  """Two results in the run's folder for diff's generated arguments."""
  Path("a.json").write_text(json.dumps(ROWS_DOC))
  Path("b.json").write_text(json.dumps(INFER_DOC))


@pytest.mark.parametrize("command", sorted(COMMANDS))
@given(data=st.data())
def test_every_commands_argument_vector_is_answered_in_one_line(saved_results, command, data):
  argv, invalid = data.draw(argument_vectors(command))
  ran = run_cli(argv)
  check_promise(ran, argv)
  if invalid:
    assert ran.code == 2, f"jaxmem {' '.join(argv)}: a value its parser refuses was accepted (exit {ran.code})"


# ----------------------------------------------------------------------------- the public API

ANY = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**6), st.floats(allow_nan=True, allow_infinity=True),
                st.text(max_size=6), st.lists(st.one_of(st.integers(-2, 4), st.text(max_size=3)), max_size=3),
                st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
# The workload's own fields: a value of its kind, or one it must refuse (invalid by construction).
FIELDS: dict[str, tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]] = {
    "batch": (st.integers(1, 16), st.sampled_from([0, -1, 1.5, "x", True, [2], float("nan")])),
    "seq": (st.integers(1, 128), st.sampled_from([0, -4, 2.0, "", False, {}])),
    "slices": (st.just(1), st.sampled_from([0, -1, "two", 1.0])),
    "resident": (st.sampled_from([0, "1GiB", 1024]), st.sampled_from([-1, "1x", 1.5, [1]])),
    "mem_fraction": (st.sampled_from([None, 0.9, 1]), st.sampled_from([0, 1.5, -0.1, "x", float("inf"), True])),
    "always_compile": (st.booleans(), st.sampled_from([1, "yes", 0.0])),
    "target": (st.sampled_from(["cpu", "tpu:v5e-4", "gpu:h100"]), st.sampled_from([5, [], "", 1.5])),
    "model": (st.sampled_from(["tiny", "tiny-moe"]), st.sampled_from([5, [], "", {"a": 1}])),
    "mesh": (st.sampled_from([None, "fsdp=1", ["data=1"]]), st.sampled_from(["data=x", 5, [("data", "x")], {"a": 1}])),
}
ENTRIES = {
    "compare": lambda **kw: jaxmem.compare(**kw),
    "explain": lambda **kw: jaxmem.explain(**kw),
    "fit": lambda **kw: jaxmem.fit(**{"over": "batch", **kw}),
    "scale": lambda **kw: jaxmem.scale(**{"over": ["seq=16,32"], **kw}),
    "infer": lambda **kw: jaxmem.infer(**{k: v for k, v in kw.items() if k != "seq"}),
    "plan": lambda **kw: jaxmem.plan(**{k: v for k, v in kw.items() if k in ("model", "target", "batch", "seq")}),
}


@st.composite
def entry_calls(draw) -> tuple[str, dict[str, Any], bool]:
  name = draw(st.sampled_from(sorted(ENTRIES)))
  kw: dict[str, Any] = {"model": "tiny", "target": "cpu", "batch": 2, "seq": 16}
  invalid = False
  for field in draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=3, unique=True)):
    good, bad = FIELDS[field]
    how = draw(st.sampled_from(["good", "bad", "any"]))
    kw[field] = draw(good if how == "good" else bad if how == "bad" else ANY)
    # What ENTRIES leaves out is not given, so not refused: plan's other fields, infer's seq.
    if how == "bad" and not (name == "plan" and field not in ("model", "target", "batch", "seq")) and not (
        name == "infer" and field == "seq"):
      invalid = True
  if draw(st.booleans()):  # an axis's keyword, any value
    kw[draw(st.sampled_from(sorted(a for a in AXES if a not in ("remat", "optimizer"))))] = draw(ANY)
  return name, kw, invalid


@given(call=entry_calls())
def test_the_entry_points_answer_any_keyword_values_with_a_typed_error(call):
  name, kw, invalid = call
  try:
    accepted(lambda: ENTRIES[name](**kw))
  except jaxmem.JaxmemError as e:
    assert one_line(e), (name, kw, e)
  else:
    assert not invalid, f"jaxmem.{name}({kw}) accepted a value it must refuse"


X = jax.ShapeDtypeStruct((8, 8), jnp.float32)


@given(target=st.one_of(st.sampled_from(["cpu", "tpu:v5e-1", "gpu:h100", None, "", 5, "cpu:2"]), ANY),
       limit=st.one_of(st.sampled_from([None, -1, "1x", 0, "64MiB", 10**6, 1.5, True]), ANY),
       margin=st.one_of(st.sampled_from([0, 0.1, 1.0, -0.5, None, "1GiB", "x"]), ANY),
       resident=st.one_of(st.sampled_from([0, "1GiB", -1, None, "x"]), ANY))
def test_the_testing_helpers_answer_any_argument_with_a_typed_error(target, limit, margin, resident):
  from jaxmem.testing import assert_fits, assert_memory_below

  for call in (lambda: assert_fits(lambda a: a @ a, X, target=target, margin=margin, resident=resident),
               lambda: assert_memory_below(lambda a: a @ a, X, limit=limit, target=target)):
    try:
      accepted(call)
    except jaxmem.JaxmemError as e:
      assert one_line(e), e
  if limit is None or isinstance(limit, bool):
    with pytest.raises(jaxmem.JaxmemError):
      assert_memory_below(lambda a: a @ a, X, limit=limit, target="cpu")


# The other public functions' keywords: (a call taking the value, the values of its kind). A
# value outside them (ANY's lists, dicts, floats for a count...) must be refused or accepted, never
# raise anything but a typed error; one of the wrong JSON type must be refused.
COUNTS = st.integers(1, 64)
OTHERS: dict[str, tuple[Any, st.SearchStrategy[Any]]] = {
    **{f"estimate.{k}": (lambda v, k=k: jaxmem.estimate(**{"model": "tiny", "seq": 16, k: v}), COUNTS)
       for k in ("batch", "seq", "tensor", "data", "context", "kv_batch")},
    "estimate.capacity_factor": (lambda v: jaxmem.estimate(model="tiny-moe", seq=16, capacity_factor=v), st.floats(0.5, 4)),
    **{f"estimate.{k}": (lambda v, k=k: jaxmem.estimate(**{"model": "tiny", "seq": 16, k: v}), st.sampled_from(names))
       for k, names in (("optimizer", ["adamw", "sgd"]), ("recompute", ["none", "full", "selective"]),
                        ("precision", ["mixed", "fp32"]), ("model", ["tiny", "tiny-moe"]))},
    "target.name": (lambda v: jaxmem.target(v), st.sampled_from(["cpu", "tpu:v5e-4", "gpu:h100x8"])),
    "target.slices": (lambda v: jaxmem.target("tpu:v5e-4", slices=v), st.integers(1, 4)),
    "target.resident": (lambda v: jaxmem.target("gpu:h100", resident=v), st.sampled_from([0, "1GiB", 2**20])),
    "target.mem_fraction": (lambda v: jaxmem.target("gpu:h100", mem_fraction=v), st.floats(0.05, 1.0)),
    "load_model.name": (lambda v: jaxmem.load_model(v), st.sampled_from(["tiny", "tiny-moe", str(DATA / "tiny-qwen2.json")])),
    "remat_search.margin": (lambda v: jaxmem.remat_search(model="tiny", target="tpu:v5e-4", margin=v), st.floats(0, 0.5)),
    "remat_search.max_compiles": (lambda v: jaxmem.remat_search(model="tiny", target="tpu:v5e-4", max_compiles=v), COUNTS),
}
WRONG_TYPE = st.one_of(st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


@given(data=st.data(), name=st.sampled_from(sorted(OTHERS)))
def test_the_other_public_functions_answer_any_argument_with_a_typed_error(data, name):
  call, good = OTHERS[name]
  how = data.draw(st.sampled_from(["good", "wrong type", "any"]))
  value = data.draw(good if how == "good" else WRONG_TYPE if how == "wrong type" else ANY)
  try:
    accepted(lambda: call(value))
  except jaxmem.JaxmemError as e:
    assert one_line(e), (name, value, e)
  else:
    assert how != "wrong type", f"{name}={value!r} was accepted"
