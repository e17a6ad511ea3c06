"""The kinds of bad input issue 40 found answered by a traceback or accepted silently, each as a
plain case: one line on stderr and exit 2 from the CLI, a typed :class:`~jaxmem.JaxmemError` from
the library, nothing compiled (tests/inputs_harness.py stops a run at the compiler). The
generated cases around them are in tests/test_inputs_properties.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from inputs_harness import check_promise, one_line, run_cli, stopped_before_compiling

import jaxmem
from jaxmem import inputs

DATA = Path(__file__).parent / "data" / "hf"


@pytest.fixture
def quiet(tmp_path):
  with stopped_before_compiling(tmp_path) as mp:
    yield mp


def refused(argv: list[str]) -> str:
  """``jaxmem ARGV``'s one error line (the run must refuse it)."""
  ran = run_cli(argv)
  check_promise(ran, argv)
  assert ran.code == 2, f"jaxmem {' '.join(argv)} was accepted\n{ran.err}"
  return ran.err.strip().splitlines()[-1]


def _row(**fields: Any) -> dict[str, Any]:
  base = dict(model="tiny", target="cpu", mesh="fsdp=1", batch=2, num_devices=1, remat="none", optimizer="adamw", seq=64,
              param_dtype="float32", dtype="bfloat16", temp_size_in_bytes=100, total_bytes=300, required_bytes=300, fits=None)
  return {**base, **fields}


def _saved(path: str, doc: Any) -> str:
  Path(path).write_text(json.dumps(doc))
  return path


def _made(command: str, kind: str) -> dict[str, str]:
  return {"command": command, "version": jaxmem.__version__, "kind": kind}


# ----------------------------------------------------------------------------- diff


def test_diff_refuses_a_result_whose_rows_are_not_objects(quiet):
  good = _saved("a.json", {"made_by": _made("compare", inputs.ROWS), "rows": [_row()]})
  for rows in ([1, 2], [_row(), "x"], [[1]], {"a": 1}):
    bad = _saved("b.json", {"made_by": _made("compare", inputs.ROWS), "rows": rows})
    line = refused(["diff", good, bad])
    assert "b.json" in line
    with pytest.raises(jaxmem.NotAResult):
      jaxmem.diff(json.loads(Path(good).read_text()), json.loads(Path(bad).read_text()))


def test_diff_refuses_a_result_of_another_command(quiet):
  compared = _saved("compare.json", {"made_by": _made("compare", inputs.ROWS), "rows": [_row()]})
  inferred = _saved("infer.json", {"made_by": _made("infer", inputs.INFERENCE), "rows": [_row(phase="decode", weights="bf16")]})
  explained = _saved("explain.json", {"made_by": _made("explain", inputs.EXPLANATION), "peak_bytes": 1, "consumers": {}})
  for a, b in ((compared, inferred), (inferred, compared), (compared, explained)):
    line = refused(["diff", a, b])
    assert "compare" in line
  with pytest.raises(jaxmem.NotComparable):
    jaxmem.diff(json.loads(Path(compared).read_text()), json.loads(Path(inferred).read_text()))


def test_diff_refuses_older_results_of_two_commands_by_their_shape(quiet):
  """Results written before made_by: both ``{"rows": [...]}``, one compare's and one infer's."""
  compared = _saved("compare.json", {"rows": [_row()]})
  inferred = _saved("infer.json", {"rows": [_row(phase="decode", weights="bf16", context=128)]})
  refused(["diff", compared, inferred])
  ran = run_cli(["diff", compared, compared])
  assert ran.code == 0, ran.err


def test_a_saved_result_says_what_made_it(quiet):
  ran = run_cli(["estimate", "--model", "tiny", "--format", "json"])
  assert ran.code == 0, ran.err
  assert json.loads(ran.out)["made_by"] == {"command": "estimate", "version": jaxmem.__version__, "kind": inputs.ESTIMATES}


# ----------------------------------------------------------------------------- models


@pytest.mark.parametrize("name", ["a/b--c", "a/b..c", "-a/b", "a/" + "x" * 97, "a/b c", "org/name@"])
def test_a_hub_id_the_hub_client_would_refuse_is_one_line(quiet, name):
  from huggingface_hub.utils import HFValidationError

  refused(["estimate", "--model", name])
  try:
    jaxmem.load_model(name)
  except HFValidationError as e:  # pragma: no cover - the traceback this test is for
    raise AssertionError(f"{name!r}: {e}") from None
  except jaxmem.JaxmemError as e:
    assert one_line(e)


def _mutated(tmp: Path, name: str, **fields: Any) -> str:
  doc = json.loads((DATA / f"{name}.json").read_text())
  at = doc.get("text_config", doc) if name.startswith(("tiny-gemma3", "tiny-gemma4", "tiny-llama4")) else doc
  at.update(fields)
  path = tmp / f"{name}-mutated.json"
  path.write_text(json.dumps(doc))
  return str(path)


@pytest.mark.parametrize("field, value", [("hidden_size", "64"), ("num_hidden_layers", 2.5), ("vocab_size", None),
                                          ("num_attention_heads", [4]), ("rms_norm_eps", "small"), ("hidden_size", -64)])
def test_a_config_json_field_of_the_wrong_type_or_range_is_one_line(quiet, tmp_path, field, value):
  path = _mutated(tmp_path, "tiny-qwen2", **{field: value})
  line = refused(["estimate", "--model", path])
  assert field in line
  with pytest.raises(jaxmem.JaxmemError, match=field):
    jaxmem.load_model(path)


@pytest.mark.parametrize("name", sorted(p.stem for p in DATA.glob("tiny-*.json")))
def test_layer_types_of_the_wrong_length_is_refused_on_every_family(quiet, tmp_path, name):
  doc = json.loads((DATA / f"{name}.json").read_text())
  at = doc.get("text_config", doc)
  layers = at["num_hidden_layers"]
  kinds = at.get("layer_types") or ["full_attention"] * layers
  for wrong in (kinds[:-1], [*kinds, kinds[-1]]):
    path = _mutated(tmp_path, name, layer_types=wrong)
    with pytest.raises(jaxmem.JaxmemError) as e:
      jaxmem.load_model(path)
    assert one_line(e.value)
  refused(["estimate", "--model", path])


# ----------------------------------------------------------------------------- jaxmem.testing

X = jax.ShapeDtypeStruct((8, 8), jnp.float32)


def test_the_testing_helpers_refuse_no_target_and_no_limit(quiet):
  from jaxmem.testing import assert_fits, assert_memory_below

  with pytest.raises(jaxmem.JaxmemError, match="target") as e:
    assert_fits(lambda a: a @ a, X, target=None)
  assert one_line(e.value)
  for limit in (None, -1, "1x", True):
    with pytest.raises(jaxmem.JaxmemError, match="limit") as e:
      assert_memory_below(lambda a: a @ a, X, limit=limit)
    assert one_line(e.value)
  with pytest.raises(jaxmem.JaxmemError, match="margin"):
    assert_fits(lambda a: a @ a, X, target="tpu:v5e-1", margin=None)


def test_resident_applies_to_a_target_given_as_a_target_as_to_its_name():
  from jaxmem.hardware.targets import get_target, resolved_target

  by_name = resolved_target("gpu:h100", resident=2**30)
  by_target = resolved_target(get_target("gpu:h100"), resident=2**30)
  assert by_target.capacity_bytes == by_name.capacity_bytes < resolved_target("gpu:h100").capacity_bytes


@pytest.mark.parametrize("args", [[], ["--target", "cpu"]])
def test_python_m_jaxmem_testing_is_not_a_command(args):
  done = subprocess.run([sys.executable, "-m", "jaxmem.testing", *args], capture_output=True, text=True, timeout=120)
  assert done.returncode == 2
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1 and "jaxmem --help" in lines[0] and "Traceback" not in done.stderr
  assert done.stdout == ""


# ----------------------------------------------------------------------------- the public API


def test_a_keyword_that_names_no_field_is_a_typed_error():
  with pytest.raises(jaxmem.UnknownField, match="remats"):
    jaxmem.Workload.of(None, remats="full")
  with pytest.raises(TypeError):  # as Python answers an unknown keyword
    jaxmem.Workload.of(None, remats="full")
