"""The dtypes as sweep axes: ``qk_dtype`` and the precision dtypes take a comma
list like ``--microbatches 1,4``, one row per value, in the rows, the cache key and the table.

The parser and planner tests compile nothing; one sweep compiles the tiny model twice for
tpu:v5e-1 (a fast compile) and holds the two rows against each other."""

from __future__ import annotations

import pytest

from jaxmem import InferWorkload, Workload
from jaxmem.cli import build_parser
from jaxmem.cli import _common as c
from jaxmem.errors import JaxmemError
from jaxmem.inference.workload import plan_infer
from jaxmem.planning import sweep
from jaxmem.resolve import plan
from jaxmem.render import tables

TINY = dict(model="tiny", target="cpu", batch=2, seq=16, remat="none")


def test_workload_takes_dtype_lists():
  w = Workload(qk_dtype="bfloat16, float32", master_dtype="none,float32", moments_dtype=["default", "bfloat16"])
  assert w.qk_dtype == ("bfloat16", "float32")
  assert w.master_dtype == (None, "float32")
  assert w.moments_dtype == (None, "bfloat16")
  assert w.grad_reduce_dtype == (None,)
  # A single value, as the fields took before, is a one-entry axis.
  assert Workload(master_dtype="float32").master_dtype == ("float32",)
  assert Workload(qk_dtype="float32") == Workload(qk_dtype=("float32",))


@pytest.mark.parametrize("cmd", ["compare", "fit", "scale", "explain", "infer"])
def test_every_command_passes_the_qk_dtype_list(cmd):
  args = build_parser().parse_args([cmd, "--model", "tiny", "--qk-dtype", "bfloat16,float32"])
  kind = InferWorkload if cmd == "infer" else Workload
  assert c.workload(args, kind).qk_dtype == ("bfloat16", "float32")


def test_the_precision_flags_are_lists():
  args = build_parser().parse_args(
      ["compare", "--master-dtype", "none,float32", "--moments-dtype", "bfloat16,float32", "--grad-reduce-dtype", "bfloat16"]
  )
  w = c.workload(args)
  assert (w.master_dtype, w.moments_dtype, w.grad_reduce_dtype) == ((None, "float32"), ("bfloat16", "float32"), ("bfloat16",))


def test_the_sweep_takes_every_combination_each_its_own_cache_key():
  p = plan(**TINY, qk_dtype="bfloat16,float32", moments_dtype="float32,bfloat16")
  tasks = p.tasks()
  got = {(t.qk_dtype, t.workload.moments_dtype) for t in tasks}
  assert got == {(q, (m,)) for q in ("bfloat16", "float32") for m in ("float32", "bfloat16")}
  assert len({t.cache_key() for t in tasks}) == len(tasks) == 4


@pytest.mark.parametrize(
    "fields, bad, valid",
    [
        (dict(qk_dtype="bfloat16,fp32"), "'fp32'", "valid: bfloat16, float32"),
        (dict(moments_dtype="float32,bf16"), "'bf16'", "valid: float32, bfloat16"),
        (dict(master_dtype="none,f32", param_dtype="bfloat16"), "'f32'", "none for the default"),
        (dict(grad_reduce_dtype="none,int8"), "'int8'", "valid:"),
    ],
)
def test_a_bad_item_is_named_with_the_valid_ones(fields, bad, valid):
  with pytest.raises(JaxmemError) as e:
    plan(**{**TINY, **fields})
  msg = str(e.value)
  assert bad in msg and valid in msg and "\n" not in msg


def test_an_empty_list_is_refused():
  with pytest.raises(JaxmemError, match="`qk_dtype` is empty"):
    plan(**TINY, qk_dtype=",")


@pytest.mark.parametrize("field", ["qk_dtype", "moments_dtype"])
def test_explain_takes_one_of_each(field):
  from jaxmem.buffers.explain import explain_workload

  with pytest.raises(JaxmemError, match=f"explain takes one `{field}`"):
    explain_workload(**TINY, **{field: "bfloat16,float32"})


def test_infer_sweeps_qk_dtype_over_prefill_only():
  p = plan_infer(model="tiny", target="cpu", qk_dtype="bfloat16,float32", prompt=16, context="32")
  got = [(cfg[2], cfg[6]["qk_dtype"]) for cfg in p.configs()]
  assert got == [("prefill", "bfloat16"), ("prefill", "float32"), ("decode", "bfloat16")]


def test_the_table_shows_a_column_for_a_dtype_that_varies():
  base = dict(model="tiny", target="cpu", mesh="fsdp=1", remat="none", optimizer="adamw", batch=2, seq=16,
              param_dtype="float32", dtype="bfloat16", num_devices=1)
  rows = [sweep.Row(**base, moments_dtype=m) for m in ("float32", "bfloat16")]
  text = tables.render_compare(rows, "table")
  heading, _, header = text.splitlines()[:3]
  assert "moments dtype" in header and "moments" not in heading
  one = tables.render_compare(rows[1:], "table")
  assert "moments dtype" not in one and "bfloat16 moments" in one.splitlines()[0]


@pytest.mark.slow  # two TPU compiles, 11 s; tests/test_precision.py's rows fixture sweeps moments on the CPU
@pytest.mark.needs_tpu_compiler
def test_a_moments_sweep_compiles_a_row_per_dtype():
  """Two rows from one sweep, told apart by their moments' dtype: Adam's float32 moments hold
  twice the bytes of bfloat16 ones, so that row's arguments are larger by about the moments'
  half (tiny on tpu:v5e-1: its layouts pad, so only the order is held)."""
  rows = sweep.compare(model="tiny", target="tpu:v5e-1", batch=1, seq=16, remat="none", moments_dtype="float32,bfloat16")
  assert [r.moments_dtype for r in rows] == ["float32", "bfloat16"]
  f32, bf16 = rows
  assert f32.error is None and bf16.error is None
  assert f32.optimizer_state_bytes > bf16.optimizer_state_bytes
  assert f32.argument_size_in_bytes > bf16.argument_size_in_bytes
  assert f32.param_bytes == bf16.param_bytes
  # Each row is its own baseline (its own program), not the other's.
  assert f32.recompute_overhead_pct == bf16.recompute_overhead_pct == 0


# --- the outer axes (jaxmem.workload.OUTER_AXES): the model's dtypes, dropout, the step's layout ---


def test_an_outer_axis_is_one_value_or_a_tuple():
  w = Workload(param_dtype="bfloat16,float32", dropout="0,0.1", sequence_parallel="off,on",
               pipeline_microbatches="none,8", pipeline_repeats="1,2")
  assert (w.param_dtype, w.dropout, w.sequence_parallel) == (("bfloat16", "float32"), (0.0, 0.1), (False, True))
  assert (w.pipeline_microbatches, w.pipeline_repeats) == ((None, 8), (1, 2))
  one = Workload(param_dtype="bfloat16", dropout="0.1", sequence_parallel=True, pipeline_repeats="2")
  assert (one.param_dtype, one.dropout, one.sequence_parallel, one.pipeline_repeats) == ("bfloat16", 0.1, True, 2)


def test_sequence_parallel_flag_alone_is_on_and_takes_a_list():
  parse = build_parser().parse_args
  assert c.workload(parse(["compare", "--sequence-parallel"])).sequence_parallel is True
  assert c.workload(parse(["compare", "--sequence-parallel", "off,on"])).sequence_parallel == (False, True)
  assert c.workload(parse(["compare"])).sequence_parallel is False
  w = c.workload(parse(["compare", "--param-dtype", "bfloat16,float32", "--dropout", "0,0.1", "--pipeline-repeats", "1,2"]))
  assert (w.param_dtype, w.dropout, w.pipeline_repeats) == (("bfloat16", "float32"), (0.0, 0.1), (1, 2))


def test_an_outer_sweep_plans_every_combination():
  p = plan(**TINY, param_dtype="bfloat16,float32", dropout="0,0.1")
  assert len(p.variants) == 4
  tasks = p.tasks()
  assert {(t.workload.param_dtype, t.workload.dropout) for t in tasks} == {
      (d, r) for d in ("bfloat16", "float32") for r in (0.0, 0.1)}
  assert len({t.cache_key() for t in tasks}) == len(tasks) == 4
  # Each task's plan is its own combination's: the model it builds has that dtype and dropout.
  from jaxmem.resolve import for_task

  for t in tasks:
    one = for_task(p, t)[0]
    assert (one.cfg.param_dtype, one.choices.dropout) == (t.workload.param_dtype, t.workload.dropout)


@pytest.mark.parametrize(
    "fields, words",
    [
        (dict(dropout="0,2"), "`dropout` must be a probability in [0, 1), got 2.0"),
        (dict(dropout="0,x"), "got 'x'"),
        (dict(sequence_parallel="off,maybe"), "takes on or off, comma separated, got 'maybe'"),
        (dict(param_dtype="bfloat16,int8"), "must name a float dtype (e.g. float32, bfloat16), got 'int8'"),
        (dict(pipeline_repeats="1,0"), "`pipeline_repeats` must be a whole number of at least 1, got 0"),
        (dict(param_dtype="bfloat16,float32", master_dtype="float32"), "not wider than the parameters' float32"),
    ],
)
def test_a_bad_outer_item_is_one_line(fields, words):
  with pytest.raises(JaxmemError) as e:
    plan(**{**TINY, **fields})
  assert words in str(e.value) and "\n" not in str(e.value)


def test_one_configuration_commands_refuse_an_outer_list():
  from jaxmem.buffers.explain import explain_workload

  with pytest.raises(JaxmemError, match="explain takes one `param_dtype`"):
    explain_workload(**TINY, param_dtype="bfloat16,float32")
  with pytest.raises(JaxmemError, match="infer takes one `dtype`"):
    plan_infer(model="tiny", target="cpu", dtype="bfloat16,float32")


def test_the_table_shows_param_dtype_and_dropout_columns_where_they_vary():
  base = dict(model="tiny", target="cpu", mesh="fsdp=1", remat="none", optimizer="adamw", batch=2, seq=16,
              dtype="bfloat16", num_devices=1)
  rows = [sweep.Row(**base, param_dtype=d, dropout=r) for d in ("float32", "bfloat16") for r in (0.0, 0.1)]
  heading, _, header = tables.render_compare(rows, "table").splitlines()[:3]
  assert "param dtype" in header and "dropout" in header
  assert "params" not in heading and "dropout" not in heading and "bfloat16 compute" in heading
  # Each row is compared with the baseline of its own combination, not another's.
  keys = {sweep.baseline_key(r) for r in rows}
  assert len(keys) == 4


def test_the_recommendation_names_a_swept_dtype():
  base = dict(model="tiny", target="cpu", mesh="fsdp=1", remat="none", optimizer="adamw", batch=2, seq=16,
              param_dtype="float32", dtype="bfloat16", num_devices=1, capacity_bytes=100, fits=True, required_bytes=10)
  rows = [sweep.Row(**base, moments_dtype="bfloat16"), sweep.Row(**base, moments_dtype="float32")]
  assert "moments dtype bfloat16, remat none" in tables.render_ranked(rows, "table").splitlines()[0]


def test_scale_fits_each_dtype_apart():
  from jaxmem.planning.scale import growth_exponents

  base = dict(model="tiny", target="cpu", mesh="fsdp=1", remat="none", optimizer="adamw", batch=2,
              param_dtype="float32", dtype="bfloat16", num_devices=1)
  # Temp linear in seq for float32 moments, quadratic for bfloat16: fitted together they would mix.
  rows = [sweep.Row(**base, seq=s, moments_dtype=m, temp_size_in_bytes=s ** p)
          for m, p in (("float32", 1), ("bfloat16", 2)) for s in (128, 256)]
  got = {g.moments_dtype: g.seq_exponent for g in growth_exponents(rows, {"seq": [128, 256]})
         if g.component == "temp_size_in_bytes"}
  assert got == {"float32": 1.0, "bfloat16": 2.0}
  text = tables.render_scale(rows, growth_exponents(rows, {"seq": [128, 256]}), "table")
  assert text.count("moments dtype") == 2  # the rows' table and the exponents'
