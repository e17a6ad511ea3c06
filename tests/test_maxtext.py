"""MaxText's own train step as a step source (``maxtext=``, ``--maxtext``), on a tiny MaxText
model compiled for ``tpu:v5e-4``: its memory fields equal those MaxText's ``train_compile``
prints for the same config, the policies behave as policies do, and what has no MaxText mapping
is one line. Skipped where MaxText is not installed (the ``maxtext`` extra, Python >= 3.12); the
refusals that need no MaxText are in tests/test_maxtext_missing.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("maxtext")

import jaxmem  # noqa: E402
from jaxmem.cli import main  # noqa: E402
from jaxmem.errors import JaxmemError  # noqa: E402

pytestmark = pytest.mark.needs_tpu_compiler

TARGET = "tpu:v5e-4"
# A two-layer Llama-style decoder, small enough to compile in seconds.
TINY = (
    "base.yml", "base_num_decoder_layers=2", "base_emb_dim=64", "base_num_query_heads=2", "base_num_kv_heads=2",
    "base_mlp_dim=128", "head_dim=32", "vocab_size=256", "max_target_length=64", "per_device_batch_size=1",
)
# Wider and longer, so that what a policy saves outweighs the compiler's own scratch.
WIDER = (
    "base.yml", "base_num_decoder_layers=4", "base_emb_dim=256", "base_num_query_heads=4", "base_num_kv_heads=4",
    "base_mlp_dim=1024", "head_dim=64", "vocab_size=256", "max_target_length=256", "per_device_batch_size=4",
)
FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
          "generated_code_size_in_bytes")


def _train_compile(args: tuple[str, ...], topology: str) -> dict[str, int]:
  """The memory fields MaxText's ``train_compile`` prints ("Memory analysis: ..."), run as a
  MaxText user runs it, in its own process."""
  import maxtext

  config = os.path.join(os.path.dirname(maxtext.__file__), "configs", args[0])
  env = {**os.environ, "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
  out = subprocess.run(
      [sys.executable, "-m", "maxtext.trainers.pre_train.train_compile", config, *args[1:],
       f"compile_topology={topology}", "compile_topology_num_slices=1", "jax_cache_dir="],
      capture_output=True, text=True, env=env, timeout=1200,
  )
  line = next((x for x in out.stdout.splitlines() if x.startswith("Memory analysis:")), None)
  assert line is not None, out.stdout[-2000:] + out.stderr[-4000:]
  return {k: int(v) for k, v in re.findall(r"(\w+_in_bytes)=(\d+)", line)}


def test_figures_equal_train_compile():
  """The same program as MaxText's train_compile: every memory field, byte for byte."""
  overrides = (*TINY, "remat_policy=minimal", "attention=dot_product")
  (row,) = jaxmem.compare(maxtext=overrides, target=TARGET)
  assert row.error is None, row.error
  theirs = _train_compile(overrides, TARGET.split(":")[1])
  assert {f: getattr(row, f) for f in FIELDS} == {f: theirs[f] for f in FIELDS}
  assert (row.model, row.remat, row.attention, row.batch, row.seq) == ("maxtext:base", "minimal", "dot_product", 4, 64)


def test_jaxmem_axes_map_onto_maxtext_options():
  """--remat, --attention, --batch and --mesh set MaxText's remat_policy, attention,
  per_device_batch_size and ici_*: the same figures as the overrides that say so."""
  (mapped,) = jaxmem.compare(maxtext=TINY[:-1], target=TARGET, remat="minimal", attention="dot", batch=16,
                             mesh="data=2,fsdp=2")
  (said,) = jaxmem.compare(
      maxtext=(*TINY[:-1], "per_device_batch_size=4", "remat_policy=minimal", "attention=dot_product",
               "ici_data_parallelism=2", "ici_fsdp_parallelism=2"), target=TARGET)
  assert (mapped.mesh, mapped.batch, mapped.remat, mapped.attention) == ("data=2,fsdp=2", 16, "minimal", "dot_product")
  assert (said.mesh, said.batch) == ("data=2,fsdp=2", 16)
  assert {f: getattr(mapped, f) for f in FIELDS} == {f: getattr(said, f) for f in FIELDS}


def test_policies_and_batch_act_on_maxtext_step():
  """MaxText's full recomputes more of the layer than minimal (which saves every projection),
  and a larger batch keeps more: the mapped options reach MaxText's program."""
  rows = jaxmem.compare(maxtext=WIDER[:-1], target=TARGET, remat="full,minimal", attention="dot", batch=16)
  by = {r.remat: r for r in rows}
  assert set(by) == {"full", "minimal"}
  assert by["full"].program_flops > by["minimal"].program_flops
  assert by["full"].param_bytes == by["minimal"].param_bytes > 0
  assert by["full"].optimizer_state_bytes > by["full"].param_bytes  # adamw's two moments
  (larger,) = jaxmem.compare(maxtext=WIDER[:-1], target=TARGET, remat="full", attention="dot", batch=32)
  assert larger.temp_size_in_bytes > by["full"].temp_size_in_bytes


@pytest.mark.parametrize(("fields", "says"), [
    (dict(remat="dots_saveable"), "`remat` dots_saveable has no MaxText mapping"),
    (dict(remat="minimal", maxtext=(*TINY, "remat_policy=full")), "`remat` gives remat_policy=minimal but the MaxText override says remat_policy=full"),
    (dict(attention="chunked"), "`attention` chunked has no MaxText mapping"),
    (dict(optimizer="lion"), "`optimizer` lion has no MaxText mapping"),
    (dict(mesh="sequence=4"), "`mesh` axis sequence has no MaxText mapping"),
    (dict(qk_dtype="float32"), "`qk_dtype` float32 has no MaxText mapping"),
    (dict(moe_impl="capacity"), "`moe_impl` and `capacity_factor` apply to mixture-of-experts models"),
    (dict(pipeline_microbatches=4), "apply to meshes with a stage axis"),
    (dict(target="cpu"), "`maxtext` compiles for TPU targets"),
    (dict(batch=8), "`batch` gives per_device_batch_size=2 but the MaxText override says per_device_batch_size=1"),
    (dict(seq=128), "`seq` gives max_target_length=128 but the MaxText override says max_target_length=64"),
])
def test_refused_in_one_line(fields, says):
  with pytest.raises(JaxmemError, match=re.escape(says)) as e:
    jaxmem.compare(**{"maxtext": TINY, "target": TARGET, **fields})
  assert "\n" not in str(e.value)


def test_cli_maxtext(capsys):
  """``--maxtext CONFIG key=value ...`` on compare: MaxText's step, one row, JSON on stdout."""
  assert main(["compare", "--maxtext", *TINY, "remat_policy=full", "--target", TARGET, "--format", "json"]) == 0
  out = capsys.readouterr().out
  import json

  (row,) = json.loads(out)["rows"] if out.lstrip().startswith("{") else json.loads(out)
  assert (row["model"], row["remat"]) == ("maxtext:base", "full")
  assert row["temp_size_in_bytes"] > 0


def test_cli_refusal_is_one_line(capsys):
  assert main(["compare", "--maxtext", *TINY, "--remat", "dots_saveable", "--target", TARGET]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].startswith("jaxmem: error: `remat` dots_saveable has no MaxText mapping") or any(
      "has no MaxText mapping" in x and x.startswith("jaxmem: error:") for x in err)


def test_explain_names_maxtext_buffers():
  """explain on MaxText's step: the same compiled program as compare's row, its buffers listed."""
  overrides = (*TINY, "remat_policy=minimal", "attention=dot_product")
  (row,) = jaxmem.compare(maxtext=overrides, target=TARGET)
  ex = jaxmem.explain(maxtext=overrides, target=TARGET, top=5)
  assert ex.peak_bytes == row.peak_memory_in_bytes
  assert ex.arguments and ex.peak_buffers


def test_scale_over_seq_maps_max_target_length():
  """scale's grid sets MaxText's max_target_length: one row per point, the policy MaxText's own."""
  no_seq = tuple(a for a in TINY if not a.startswith("max_target_length="))
  s = jaxmem.scale(maxtext=no_seq, target=TARGET, over={"seq": [64, 128]}, attention="dot")
  assert [(r.remat, r.seq) for r in s.rows] == [("full", 64), ("full", 128)]
  assert all(r.error is None for r in s.rows)
  assert s.rows[1].temp_size_in_bytes > s.rows[0].temp_size_in_bytes


def test_slices_map_onto_compile_topology_num_slices():
  """A multi-slice target is MaxText's accelerator type of one slice and its number of slices."""
  from jaxmem.maxtext import step as mx

  assert mx.topology(jaxmem.target("tpu:v4-128", slices=2)) == ("v4-128", 2)
  assert mx.topology(jaxmem.target("tpu:v5p-8")) == ("v5p-8", 1)
  # MaxText names TPU7x slices by libtpu's name of the generation, never v7x-N.
  assert mx.topology(jaxmem.target("tpu:v7x-128")) == ("tpu7x-128", 1)


def test_batch_and_seq_are_maxtexts_own_unless_given(capsys):
  """Without --batch and --seq, MaxText's config says them (global batch: per_device_batch_size x
  devices); given, they map onto it, a batch of 8 (jaxmem's own default) included."""
  own = (*TINY[:-2], "max_target_length=128", "per_device_batch_size=3")
  assert main(["compare", "--maxtext", *own, "--target", TARGET, "--format", "json"]) == 0
  import json

  out = json.loads(capsys.readouterr().out)
  (row,) = out["rows"] if isinstance(out, dict) else out
  assert (row["batch"], row["seq"]) == (3 * 4, 128)
  (given,) = jaxmem.compare(maxtext=TINY[:-2], target=TARGET, batch=8, seq=128)
  (said,) = jaxmem.compare(maxtext=(*TINY[:-2], "per_device_batch_size=2", "max_target_length=128"), target=TARGET)
  assert (given.batch, given.seq) == (said.batch, said.seq) == (8, 128)
  assert {f: getattr(given, f) for f in FIELDS} == {f: getattr(said, f) for f in FIELDS}


def test_microbatches_split_the_global_batch():
  """--microbatches is MaxText's gradient_accumulation_steps, splitting jaxmem's global batch:
  per_device_batch_size is the batch over the devices and the microbatches."""
  (mapped,) = jaxmem.compare(maxtext=TINY[:-1], target=TARGET, batch=8, microbatches=2, attention="dot")
  (said,) = jaxmem.compare(maxtext=(*TINY[:-1], "per_device_batch_size=1", "gradient_accumulation_steps=2",
                                    "attention=dot_product"), target=TARGET)
  assert (mapped.batch, mapped.microbatches) == (said.batch, said.microbatches) == (8, 2)
  assert {f: getattr(mapped, f) for f in FIELDS} == {f: getattr(said, f) for f in FIELDS}


# WIDER at a longer sequence: a batch step is worth MiBs, so fit's search closes in few compiles.
LONG = (*WIDER[:-2], "max_target_length=1024")


@pytest.mark.slow  # about four minutes on a loaded 2-core machine: five compiles near a capped capacity
def test_fit_finds_the_largest_batch_that_fits():
  """fit through MaxText's step: with another program resident, so that the capacity left is
  8 MiB above what batch 8 needs, the batch found fits (at least the smallest, 4), the next
  step up does not, and the sequence is MaxText's max_target_length."""
  (eight,) = jaxmem.compare(maxtext=LONG, target=TARGET, remat="full", attention="dot", batch=8)
  resident = jaxmem.target(TARGET).capacity_bytes - (eight.required_bytes + 8 * 2**20)
  (found,) = jaxmem.fit(maxtext=LONG, target=TARGET, remat="full", attention="dot", resident=resident)
  assert found.max_batch is not None and found.max_batch >= 4 and found.row.fits
  assert (found.row.batch, found.row.seq, found.row.remat) == (found.max_batch, 1024, "full")
  assert found.note is None  # neither the smallest refused nor the ceiling reached
  (beyond,) = jaxmem.compare(maxtext=LONG, target=TARGET, remat="full", attention="dot", resident=resident,
                             batch=found.max_batch + 4)  # fit's step on fsdp=4: the devices
  assert beyond.fits is False


def test_plan_searches_maxtexts_options(capsys):
  """plan --maxtext: MaxText's step searched within the budget, each row fitting or refused with
  a reason, ranked as plan ranks, and the recommendation's overrides (--emit maxtext) compile,
  through compare, to the same figures."""
  from jaxmem.maxtext.table import REMATS
  from jaxmem.planning.search import label, rank_rows
  from jaxmem.planning.sweep import row_from_dict

  own = (*TINY[:-1], "per_device_batch_size=2")
  assert main(["plan", "--maxtext", *own, "--target", TARGET, "--budget", "3", "--emit", "maxtext",
               "--format", "json"]) == 0
  import json

  out = json.loads(capsys.readouterr().out)
  assert 1 <= out["compiles"] <= 3 and out["batch"] == 2 * 4 and out["seq"] == 64
  rows = [row_from_dict(r) for r in out["rows"]]
  for r in rows:
    assert r.model == "maxtext:base" and r.remat in REMATS
    assert r.fits or r.error or (r.required_bytes or 0) > r.capacity_bytes
  assert [label(r) for r in rank_rows(rows)] == [label(r) for r in rows]
  assert any("left out" in n for n in out["notes"])
  best = out["recommended"]
  assert best is not None and best == out["rows"][0]
  launch = out["maxtext"]["overrides"]
  args = ("base.yml", *(f"{k}={v}" for k, v in launch.items()))
  (again,) = jaxmem.compare(maxtext=args, target=TARGET)
  assert {f: getattr(again, f) for f in FIELDS} == {f: best[f] for f in FIELDS}
  assert (again.mesh, again.remat, again.microbatches, again.attention) == (
      best["mesh"], best["remat"], best["microbatches"], best["attention"])


def test_plan_refuses_what_it_searches():
  with pytest.raises(JaxmemError, match="plan searches MaxText's remat_policy") as e:
    jaxmem.plan(maxtext=(*TINY, "remat_policy=full"), target=TARGET, budget=1)
  assert "\n" not in str(e.value)


def test_a_plan_of_jaxmems_model_compiles_as_its_maxtext_launch():
  """plan --emit maxtext on jaxmem's tiny model, given back as compare --maxtext base.yml
  <overrides>: MaxText's step compiles at the recommended configuration (its mesh, batch,
  sequence, microbatches and kernel), the policy the launch names (jaxmem's none has no MaxText
  program: the launch leaves MaxText's full, and its note says so)."""
  from jaxmem.mesh import parse_mesh

  result = jaxmem.plan(model="tiny", target=TARGET, batch=8, seq=256, budget=2)
  best, launch = result.recommended, jaxmem.maxtext_overrides(result)
  (row,) = jaxmem.compare(maxtext=("base.yml", *launch.line().split()), target=TARGET)
  assert row.error is None and row.fits, row.error
  assert dict(parse_mesh(row.mesh)) == dict(parse_mesh(best.mesh))
  assert (row.batch, row.seq, row.microbatches) == (best.batch, best.seq, best.microbatches)
  assert row.attention == launch.overrides.get("attention", "autoselected")
  assert row.remat == launch.overrides.get("remat_policy", "full")
  assert best.remat in launch.overrides.get("remat_policy", "") or any(
      n.startswith(f"remat {best.remat} has no MaxText mapping") for n in launch.notes)
