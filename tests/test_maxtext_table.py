"""The one MaxText mapping (jaxmem/maxtext/table.py), read by ``--maxtext``, ``plan --maxtext`` and
``plan --emit maxtext``: an axis without a row is refused; where MaxText is installed, what emit
writes for every configuration plan can recommend is taken by ``compare --maxtext base.yml
<overrides>`` (MaxText's own parser; tests/test_maxtext.py compiles one), and an option is either
spelt by both readers or refused by both in the same words."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from jaxmem.axes import AXES
from jaxmem.errors import JaxmemError
from jaxmem.maxtext import emit, table
from jaxmem.mesh import parse_mesh
from jaxmem.models import get_config
from jaxmem.program.optimizers import OPTIMIZERS
from jaxmem.records import Configuration


def test_an_axis_without_a_row_is_refused_whatever_its_value():
  """A new axis is refused by both readers until the table spells it, never dropped: every
  field a configuration records is a row, spelt with one, described by emit, or refused."""
  mapped = set(table.ROWS) | set(table.SPELT_WITH)
  for name in set(AXES) - mapped:
    with pytest.raises(table.NoMaxTextMapping, match=f"^`{name}` "):
      table.row(name).write("anything", table.At())
  assert {"mesh", "remat", "attention", "microbatches", "context_strategy", "moments_dtype"} <= mapped
  assert not emit._DESCRIBED & set(AXES) - mapped


def test_a_row_writes_only_its_own_keys():
  """Each MaxText option is one row's: what a row writes for any configuration plan can
  recommend is among the keys it declares, and no two rows declare the same key."""
  for c in recommendable():
    at = emit.at_of(c, layers=2)
    values = {**{f: getattr(c, f) for f in table.ROWS}, "mesh": parse_mesh(c.mesh)}
    for name in table.ROWS:
      try:
        written = table.ROWS[name].write(values[name], at)
      except table.NoMaxTextMapping:
        continue
      assert set(written) <= set(table.ROWS[name].keys), (name, written)
  keys = [k for r in table.ROWS.values() for k in r.keys]
  assert sorted(k for k in set(keys) if keys.count(k) > 1) == []


def test_a_refusal_is_typed_and_worded_for_each_reader():
  with pytest.raises(table.NoMaxTextMapping) as e:
    table.row("qk_dtype").write("float32", table.At())
  assert isinstance(e.value, JaxmemError) and (e.value.name, e.value.value) == ("qk_dtype", "float32")
  assert str(e.value).startswith("`qk_dtype` float32 has no MaxText mapping: ")
  assert e.value.note == str(e.value).replace("`", "")  # emit's note: the same words, the field bare


def test_the_optimizer_state_comes_from_the_registry():
  """plan --maxtext sizes the optimizer's state from jaxmem's registry, by MaxText's opt_type
  name; one jaxmem has no optimizer for is refused, never given a default."""
  for name in table.OPTIMIZERS_SPELT:
    assert table.state_moments(name) == OPTIMIZERS.get(name).state_moments
  assert table.state_moments("sgd") == 0 < table.state_moments("adamw")
  with pytest.raises(table.NoMaxTextMapping, match="adam_pax"):
    table.state_moments("adam_pax")


# ---------------------------------------------------------------- through MaxText's own parser

TARGET = "tpu:v5e-4"
# MaxText's own step for the refusals: a two-layer Llama-style decoder.
TINY = ("base.yml", "base_num_decoder_layers=2", "base_emb_dim=64", "base_num_query_heads=2", "base_num_kv_heads=2",
        "base_mlp_dim=128", "head_dim=32", "vocab_size=256", "max_target_length=256", "per_device_batch_size=2")


def conf(**kw) -> Configuration:
  """A configuration plan recommends for the tiny model on tpu:v5e-4 unless told otherwise."""
  base = dict(model="tiny", target=TARGET, mesh="fsdp=4", batch=8, num_devices=4, remat="minimal", optimizer="adamw",
              seq=256, param_dtype="float32", dtype="bfloat16", attention="splash")
  return Configuration(**{**base, **kw})


def recommendable() -> list[Configuration]:
  """Every value plan can choose for each row of the table, one row varied at a time from
  :func:`conf`: the meshes, schedules, policies, microbatches and kernels its search tries
  (jaxmem.planning.search), and the options a workload gives it."""
  from jaxmem.planning import search

  cfg = get_config("tiny")
  out = []
  for mesh in search.factorizations(4, search.search_axes(cfg)):
    if search.mesh_reason(mesh, cfg, 8, 256, 1) is not None:
      continue
    stages = dict(mesh).get("stage", 1)
    text = ",".join(f"{a}={s}" for a, s in mesh)
    for pm in [None] if stages == 1 else [k * stages for k in search.PIPELINE_FACTORS]:
      pipeline = {} if stages == 1 else dict(stages=stages, pipeline_microbatches=pm, pipeline_repeats=1)
      out.append(conf(mesh=text, **pipeline))
  out += [conf(remat=r.name) for r in search.REMAT_LADDER]
  out += [conf(microbatches=m) for m in (2, 4, 8)]
  out += [conf(attention=a) for a in ("dot", "splash")]
  out += [conf(optimizer=o) for o in OPTIMIZERS]
  out += [conf(param_dtype=p, dtype=d) for p, d in itertools.product(("float32", "bfloat16"), repeat=2)]
  out += [conf(moments_dtype=m) for m in ("bfloat16", "float32")]
  out += [conf(vocab_tiles=2), conf(dropout=0.1)]
  out += [conf(mesh="context=2,fsdp=2", context_strategy=s, attention=a)
          for s, a in (("all_gather", "splash"), ("all_gather", "dot"), ("ring", "splash"), ("ring", "chunked"))]
  out += [conf(model="tiny-moe", moe_impl="dropless", moe_kernel="gmm"),
          conf(model="tiny-moe", moe_impl="capacity", capacity_factor=1.25)]
  out += [conf(model="llama3-8b"), conf(model="tiny-gpt2")]
  out += [conf(qk_dtype="float32"), conf(master_dtype="float32", param_dtype="bfloat16"),
          conf(grad_reduce_dtype="bfloat16"), conf(mesh="tensor=2,fsdp=2", sequence_parallel=True)]
  out += [conf(target="tpu:v5e-4x2slices", num_devices=8, mesh=m) for m in ("data=2,fsdp=4", "fsdp=8")]
  out += [conf(batch=2)]  # fewer sequences than devices: a fractional per_device_batch_size
  out += [conf(target="tpu:v5p-8", quantization="fp8_full")]
  return out


@pytest.fixture(scope="module")
def maxtext():
  pytest.importorskip("maxtext")
  pytest.importorskip("maxtext.configs.pyconfig", exc_type=ImportError)


@pytest.mark.needs_tpu_compiler
def test_what_emit_writes_compare_maxtext_takes(maxtext):
  """plan --emit maxtext's overrides, given back as compare --maxtext base.yml <overrides>: taken
  by jaxmem's planner and MaxText's parser, set again the same by the step's factory, and read
  back as the configuration they came from (mesh, batch, sequence, microbatches, policy)."""
  from jaxmem.maxtext import step as mx
  from jaxmem.resolve import plan

  checked = set()
  for c in recommendable():
    launch = emit.maxtext_overrides(c)
    slices = 2 if c.target.endswith("slices") else 1
    if (launch.line(), slices) in checked:  # the same overrides as a configuration's before (a refused optimizer's)
      continue
    checked.add((launch.line(), slices))
    p = plan(maxtext=("base.yml", *launch.line().split()), target=TARGET, slices=slices)
    task = p.tasks()[0]
    # The step's factory sets again what the overrides say (MaxText's parser took them above).
    settings = mx.task_settings(task.workload, p.target, batch=p.batch, seq=p.seq, mesh=task.mesh)
    o = {k: table.text(v) for k, v in launch.overrides.items()}
    assert {k: v for k, v in settings.items() if k in o} == {k: o[k] for k in settings if k in o}, c
    assert (p.batch, p.seq, p.workload.microbatches) == (c.batch, c.seq, (c.microbatches,)), c
    assert dict(task.mesh) == dict(parse_mesh(c.mesh)), (c.mesh, task.mesh)
    assert p.remats[0].name == o.get("remat_policy", "full"), c.remat


# Options each reader is given alone, on the tiny model's configuration: (field, value) and, where
# the option needs them, the configuration's other fields.
OPTIONS = [
    *(("remat", r, {}) for r in ("dots_saveable", "selective", "checkpoint_dots", "full_offloaded", "save_qkv_proj")),
    *(("attention", a, {}) for a in ("dot", "splash", "chunked", "triton", "cudnn")),
    *(("optimizer", o, {}) for o in OPTIMIZERS),
    ("param_dtype", "float8_e4m3fn", {}), ("param_dtype", "bfloat16", {}), ("dtype", "float16", {}),
    ("moments_dtype", "bfloat16", {}), ("moments_dtype", "float8_e4m3fn", {}),
    ("vocab_tiles", 2, {}), ("dropout", 0.1, {}),
    ("mesh", "sequence=2,fsdp=2", {}),
    ("context_strategy", "ring", {"mesh": "context=2,fsdp=2", "attention": "dot"}),
    ("context_strategy", "ring", {"mesh": "context=2,fsdp=2", "attention": "splash"}),
    ("qk_dtype", "float32", {}), ("master_dtype", "float32", {}), ("grad_reduce_dtype", "bfloat16", {}),
    ("sequence_parallel", True, {"mesh": "tensor=2,fsdp=2"}), ("moe_kernel", "gmm", {}),
]
# MaxText's step takes its own remat_policy names as they are: `minimal_offloaded` there is
# MaxText's (the projections by name), while jaxmem's (every matmul without batch dimensions)
# has no spelling; and jaxmem's `none` is the baseline every list starts with, left out.
MAXTEXTS_OWN = {("remat", "minimal_offloaded"), ("remat", "none")}


@pytest.mark.needs_tpu_compiler
@pytest.mark.parametrize(("field", "value", "with_"), OPTIONS, ids=lambda v: str(v) if not isinstance(v, dict) else "")
def test_an_option_is_spelt_by_both_or_refused_by_both_in_the_same_words(maxtext, field, value, with_):
  from jaxmem.resolve import plan

  notes = emit.maxtext_overrides(conf(**{field: value, **with_})).notes
  said = [n for n in notes if " has no MaxText mapping: " in n and n.startswith(f"{field} ")]
  workload = dict(maxtext=TINY, target=TARGET, **{field: value, **with_})
  try:
    plan(**workload)
  except table.NoMaxTextMapping as e:
    assert said == [e.note], (said, e.note)
    return
  except JaxmemError as e:  # refused for another reason than the mapping (a target without host memory)
    assert "no MaxText mapping" not in str(e)
  assert said == [], said


def test_maxtexts_own_names_are_the_documented_exceptions():
  """The only jaxmem remat names emit refuses that --maxtext takes are MaxText's own names."""
  refused = set()
  for name in ("none", "minimal_offloaded", "full", "minimal"):
    try:
      table.remat_settings(name)
    except table.NoMaxTextMapping:
      refused.add(("remat", name))
  assert refused == MAXTEXTS_OWN
  assert all(table.maxtext_remat(n) == {"remat_policy": n} for _, n in MAXTEXTS_OWN if n in table.REMATS)
