"""``plan --emit maxtext``: a configuration as MaxText's overrides (pure, no compile), every
choice MaxText cannot spell named in a note, and MaxText's own config parser accepting them where
MaxText is installed."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import types

import pytest

import jaxmem
from jaxmem.maxtext import emit, table
from jaxmem.records import Configuration


def conf(**kw) -> Configuration:
  """A compiled configuration's record: llama3-8b on 8 v5p chips unless told otherwise."""
  base = dict(model="llama3-8b", target="tpu:v5p-16", mesh="data=2,fsdp=4", batch=64, num_devices=8, remat="minimal",
              optimizer="adamw", seq=8192, param_dtype="float32", dtype="bfloat16", attention="splash")
  return Configuration(**{**base, **kw})


def ici_dcn(o: dict) -> tuple[int, int]:
  return (math.prod(v for k, v in o.items() if k.startswith("ici_")),
          math.prod(v for k, v in o.items() if k.startswith("dcn_")))


def test_mesh_batch_kernel_and_model():
  launch = emit.maxtext_overrides(conf(microbatches=4, vocab_tiles=2))
  o = launch.overrides
  assert (o["ici_data_parallelism"], o["ici_fsdp_parallelism"], o["ici_tensor_parallelism"]) == (2, 4, 1)
  assert ici_dcn(o) == (8, 1) and o["dcn_data_parallelism"] == 1  # written: MaxText's default is -1
  # MaxText's global batch is per_device_batch_size x devices x gradient_accumulation_steps.
  assert o["per_device_batch_size"] * 8 * o["gradient_accumulation_steps"] == 64 and o["gradient_accumulation_steps"] == 4
  assert (o["model_name"], o["max_target_length"], o["remat_policy"], o["attention"], o["num_vocab_tiling"]) == (
      "llama3-8b", 8192, "minimal", "flash", 2)
  assert launch.notes == ()
  assert launch.line().split()[0] == "model_name=llama3-8b" and "\n" not in launch.line()
  assert jaxmem.maxtext_overrides is emit.maxtext_overrides  # the public API


def test_slices_take_the_leading_axes_over_dcn():
  for mesh, dcn in (("data=2,fsdp=8", {"data": 2}), ("fsdp=16", {"fsdp": 2}), ("data=4,fsdp=4", {"data": 2})):
    o = emit.maxtext_overrides(conf(target="tpu:v5p-16x2slices", num_devices=16, mesh=mesh)).overrides
    assert ici_dcn(o) == (8, 2)
    assert {k.split("_")[1]: v for k, v in o.items() if k.startswith("dcn_") and v > 1} == dcn


def test_pipeline_schedule():
  o = emit.maxtext_overrides(conf(model="tiny", mesh="stage=2,fsdp=2", num_devices=4, target="tpu:v5e-4", batch=8,
                                  stages=2, pipeline_microbatches=4, pipeline_repeats=1)).overrides
  assert (o["ici_pipeline_parallelism"], o["num_pipeline_microbatches"], o["num_pipeline_repeats"]) == (2, 4, 1)
  assert o["num_layers_per_pipeline_stage"] == o["base_num_decoder_layers"] // 2  # tiny, by its dimensions
  assert "num_pipeline_microbatches" not in emit.maxtext_overrides(conf()).overrides  # no stage axis


@pytest.mark.parametrize("remat,want,note", [
    ("save_dot_except_mlp", {"remat_policy": "save_dot_except_mlp"}, None),
    ("none", {}, "remat none"),
    ("full_offloaded", {"remat_policy": "custom", "decoder_layer_input": "offload"}, None),
    ("names:save=mlpwi+query_proj:offload=decoder_layer_input",
     {"remat_policy": "custom", "query_proj": "device", "decoder_layer_input": "offload"}, "tensor mlpwi"),
    ("selective", {}, "remat selective"),
])
def test_remat(remat, want, note):
  launch = emit.maxtext_overrides(conf(remat=remat))
  got = {k: v for k, v in launch.overrides.items() if k in (*want, "remat_policy", "mlpwi", "scan_layers")}
  assert got == want
  assert any(note in n for n in launch.notes) if note else launch.notes == ()


def test_what_maxtext_cannot_spell_is_named_not_dropped():
  launch = emit.maxtext_overrides(conf(model="gpt2-small", attention="triton", optimizer="lion", qk_dtype="float32"))
  o = launch.overrides
  assert not {"attention", "opt_type", "model_name", "decoder_block"} & set(o)
  said = " | ".join(launch.notes)
  for word in ("model gpt2-small", "attention triton", "optimizer lion", "qk_dtype float32"):
    assert word in said


def test_a_plan_without_a_fitting_row_has_no_launch():
  with pytest.raises(jaxmem.JaxmemError, match="no configuration that fits"):
    emit.maxtext_overrides(types.SimpleNamespace(recommended=None, rows=()))
  with pytest.raises(jaxmem.JaxmemError, match="takes a plan or a compiled row"):
    emit.maxtext_overrides(42)


# MaxText's parser in a process of its own: it starts JAX with its own settings.
_PARSE = """
import json, os, sys
import maxtext, typing
from maxtext.configs import pyconfig
from maxtext.configs.types import ModelName
base = os.path.join(os.path.dirname(maxtext.__file__), "configs", "base.yml")
out = []
for case in json.loads(sys.argv[1]):
  cfg = pyconfig.initialize(["train", base, *case, "run_name=jaxmem", "skip_jax_distributed_system=true"])
  out.append(dict(batch=cfg.global_batch_size_to_train_on, ici=list(cfg.ici_parallelism), dcn=list(cfg.dcn_parallelism),
                  remat=cfg.remat_policy, attention=cfg.attention))
print("RESULT" + json.dumps(dict(cases=out, models=sorted(typing.get_args(ModelName)))))
"""


def test_maxtexts_parser_accepts_the_overrides():
  pytest.importorskip("maxtext.configs.pyconfig", exc_type=ImportError)
  cases = [
      (conf(microbatches=2, remat="save_qkv_proj"), "v5p-16", 1),
      (conf(target="tpu:v5p-16x2slices", num_devices=16, mesh="data=2,fsdp=8", batch=32), "v5p-16", 2),
      (conf(model="tiny", mesh="stage=2,fsdp=2", num_devices=4, target="tpu:v5e-4", batch=8, seq=128, stages=2,
            pipeline_microbatches=4, pipeline_repeats=1, remat="names:save=query_proj:offload=decoder_layer_input"),
       "v5e-4", 1),
      (conf(remat="full_offloaded", attention="dot"), "v5p-16", 1),
  ]
  argv = [[*emit.maxtext_overrides(c).line().split(), f"compile_topology={topo}", f"compile_topology_num_slices={n}"]
          for c, topo, n in cases]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-c", _PARSE, json.dumps(argv)], capture_output=True, text=True, env=env,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  got = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT"))[len("RESULT"):])
  for (c, _, slices), parsed in zip(cases, got["cases"], strict=True):
    assert parsed["batch"] == c.batch
    assert math.prod(parsed["ici"]) * math.prod(parsed["dcn"]) == c.num_devices and math.prod(parsed["dcn"]) == slices
    assert parsed["remat"] == emit.maxtext_overrides(c).overrides.get("remat_policy", "full")
  assert table.MODEL_NAMES <= set(got["models"])  # each model_name written is one of MaxText's


def test_emit_with_csv_is_refused_in_one_line_naming_the_formats_it_takes(capsys):
  from jaxmem.cli import main

  code = main(["plan", "--model", "tiny", "--target", "tpu:v5e-4", "--emit", "maxtext", "--format", "csv"])
  err = capsys.readouterr().err.strip()
  assert code == 2 and "\n" not in err and "Traceback" not in err
  # The formats it names are --format's own (table, markdown, json), so the user can pass one.
  assert "--format table, markdown or json" in err, err


def test_one_vocabulary_with_the_maxtext_step():
  """emit and --maxtext (jaxmem.maxtext.plan, step) spell jaxmem's names through the one table,
  so a plan's launch and a MaxText step agree on every name; emit keeps no table of its own."""
  assert not {"ATTENTIONS", "OPTIMIZERS", "MESH_KEYS", "REMAT_SAME_NAME", "MODEL_NAMES", "DTYPES"} & set(vars(emit))
  o = emit.maxtext_overrides(conf(attention="cudnn", optimizer="muon")).overrides
  assert (o["attention"], o["opt_type"]) == (table.attention("cudnn"), "muon")
  launch = emit.maxtext_overrides(conf(mesh="sequence=2,fsdp=4"))
  assert not any("sequence" in k for k in launch.overrides)  # MaxText's base.yml mesh has no sequence axis
  with pytest.raises(table.NoMaxTextMapping, match="`mesh` axis sequence has no MaxText mapping") as e:
    table.mesh_settings((("sequence", 2), ("fsdp", 4)), table.At(devices=8))
  assert e.value.note in launch.notes  # the words --maxtext refuses it with
