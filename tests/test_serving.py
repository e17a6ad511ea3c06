"""jaxmem.inference.serving (fit --phase): the answer compiles and fits, one size up does not, no
size the argument bytes exclude is compiled, and bad input is one line."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

import jaxmem
from jaxmem.cli import main
from jaxmem.compiler import figures
from jaxmem.compiler.figures import shape_argument_bytes
from jaxmem.errors import JaxmemError
from jaxmem.inference import quant, serving
from jaxmem.inference.program import build_infer_program
from jaxmem.models import get_config
from jaxmem.render.inference import render_serving

# A v5e chip's compiler with a capacity a tiny model fills at small sizes, so every probe's
# compile is small (the compiler, not the capacity, is what is under test).
CAPACITY = 3 << 19  # 1.5 MiB: about 40 sequences' arguments at context 128


def _small_v5e():
  return dataclasses.replace(jaxmem.target("tpu:v5e-1"), capacity_bytes=CAPACITY, capacity_note="a test's capacity")


@pytest.fixture(scope="module")
def decode_search():
  """(result, probe rows, compiler calls) of one decode search over the batch at context 128."""
  calls = []
  real = figures.compile_timed

  def counted(lowered, options=None):
    calls.append(lowered)
    return real(lowered, options)

  rows = []
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(figures, "compile_timed", counted)
    (r,) = serving.fit_serving(model="tiny", target=_small_v5e(), context=128, on_row=rows.append)
  return r, rows, calls


def _argument_bytes(batch: int, context: int) -> int:
  cfg = get_config("tiny", param_dtype="bfloat16")
  t = _small_v5e()
  p = build_infer_program(cfg, phase="decode", fmt=quant.WEIGHT_FORMATS["bf16"], batch=batch, context=context,
                          target=t, mesh=(("fsdp", 1),))
  return shape_argument_bytes(p.args, 1)


@pytest.mark.needs_tpu_compiler
def test_the_answer_fits_and_one_more_sequence_does_not(decode_search):
  r, rows, _ = decode_search
  assert r.max_batch and r.row.batch == r.max_batch and r.row.context == 128
  assert r.row.fits and r.row.verdict in ("yes", "at risk") and r.row.margin_bytes >= 0
  assert r.next.batch == r.max_batch + 1 and r.next.fits is False
  # Both judged by a compile (the next one here: its arguments alone still fit).
  assert r.row.compile_seconds is not None and r.next.compile_seconds is not None
  assert r.next.required_bytes > CAPACITY >= r.row.required_bytes


@pytest.mark.needs_tpu_compiler
def test_no_size_the_arguments_exclude_is_compiled(decode_search):
  r, rows, calls = decode_search
  limit = r.argument_limit
  assert _argument_bytes(limit, 128) > CAPACITY >= _argument_bytes(limit - 1, 128)
  assert all(row.batch < limit for row in rows)
  assert all(row.weight_bytes_per_device + row.kv_cache_bytes_per_device <= CAPACITY for row in rows)
  # compiles counts the compiler's calls, one per probe.
  assert r.compiles == len(rows) == len(calls) >= 2


@pytest.mark.needs_tpu_compiler
def test_compiles_and_the_next_size_are_in_the_json(decode_search):
  r, _, _ = decode_search
  (d,) = json.loads(render_serving([r], "json"))["rows"]
  assert d["compiles"] == r.compiles and d["max_batch"] == r.max_batch and d["verdict"] == r.row.verdict
  assert d["next"]["batch"] == r.max_batch + 1 and d["next"]["compiled"] and d["next"]["fits"] is False
  assert "max batch" in render_serving([r], "table")


@pytest.mark.slow
@pytest.mark.needs_tpu_compiler
def test_an_excluded_next_size_is_reported_not_compiled():
  # At context 8192 a sequence's cache (2 MiB) outweighs the step's temporaries (under 1 MiB):
  # with room for two sequences' arguments and their temporaries but not a third's arguments,
  # two fit by a compile and the third is refused from its shapes, not compiled nor counted.
  a2, a3 = _argument_bytes(2, 8192), _argument_bytes(3, 8192)
  t = dataclasses.replace(_small_v5e(), capacity_bytes=a3 - 1)
  (r,) = serving.fit_serving(model="tiny", target=t, context=8192)
  assert a2 < a3 - 1 and r.argument_limit == 3
  assert r.max_batch == 2 and r.compiles == 1 and serving.compiled(r.row)
  assert r.next.batch == 3 and not serving.compiled(r.next) and r.next.fits is False
  assert r.next.required_bytes == a3


def test_the_bracket_finds_the_boundary_within_a_few_probes():
  # The search's logic against known monotone required bytes: affine with a fixed part, with and
  # without a padding cliff, from the top (decode) and from the smallest size (prefill).
  rng = random.Random(0)
  for _ in range(200):
    base, slope, extra = rng.randrange(1, 10**6), rng.randrange(1, 10**4), rng.randrange(0, 10**4)
    cliff = rng.choice([None, rng.randrange(2, 200)])
    capacity = base + rng.randrange(1, 300) * slope

    def required(k):
      return base + k * (slope + extra) + (0 if cliff is None or k < cliff else 40 * slope)

    limit = next(k for k in range(1, 10**6) if base + k * slope > capacity)
    b = serving._Bracket(capacity=capacity, hi=limit, slope=slope, base=base, from_top=rng.random() < 0.5)
    probes = 0
    while (k := b.next_probe()) is not None:
      assert 1 <= k < limit
      probes += 1
      fits = required(k) <= capacity
      b.record(k, _Fake(required_bytes=required(k), fits=fits))
    answer = max((k for k in range(1, limit) if required(k) <= capacity), default=0)
    assert b.lo == answer and b.hi == answer + 1
    assert probes <= 2 * limit.bit_length() + 2


@dataclasses.dataclass
class _Fake:
  required_bytes: int
  fits: bool


def test_bad_input_is_one_line():
  cases = [
      (dict(remat="full"), "`remat` is a train step's option"),
      (dict(context=0), "`context` must be at least 1"),
      (dict(batch=4), "`batch` is what `over` batch searches"),
      (dict(over="seq"), "`over` must be batch or context"),
      (dict(phase="train"), "`phase` must be one of prefill, decode"),
      (dict(target="cpu:4", mesh="tensor=4"), "`mesh` tensor=4: tensor=4 does not divide tiny's 2 kv heads"),
      (dict(target="cpu"), "needs a target with a memory capacity"),
      (dict(qk_dtype="bfloat16,float32"), "a serving fit takes one `qk_dtype`"),
  ]
  for fields, message in cases:
    kw = dict(model="tiny", target="cpu", context=128) | fields
    with pytest.raises(JaxmemError, match=message) as e:
      serving.fit_serving(**kw)
    assert "\n" not in str(e.value)


def test_cli_words_the_fields_as_flags(capsys):
  for argv, message in [
      (["--remat", "full"], "--remat is a train step's option; --phase decode"),
      (["--context", "0"], "--context must be at least 1 (got 0)"),
      (["--batch", "4"], "--batch is what --over batch searches"),
      (["--jobs", "2"], "--jobs does not apply to a serving fit"),
  ]:
    assert main(["fit", "--phase", "decode", "--model", "tiny", "--target", "cpu", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
  assert main(["fit", "--model", "tiny", "--target", "cpu", "--context", "512"]) == 2
  assert "give --phase decode or prefill" in capsys.readouterr().err
