"""The step people actually train: the attention kernel per target, gradient
accumulation, vocabulary tiling and MaxText's minimal remat, through the train program and the
CLI. Memory runs through the real TPU and GPU compilers without the hardware and asserts
relationships (a kernel's temp below half of dot's), never byte counts.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.cli import main
from jaxmem.hardware.gpu import gpu_compiler_available
from jaxmem.hardware.tpu import tpu_compiler_available
from jaxmem.compiler.flops import KERNEL_FLOPS_NOTE
from jaxmem.buffers.residuals import saved_residuals_by_policy
from jaxmem.inference.infer import infer
from jaxmem.models import get_config
from jaxmem.models.attention_kernels import CUDNN_WORKSPACE_NOTE, cudnn_version
from jaxmem.planning import sweep
from jaxmem.resolve import plan
from jaxmem.program.remat import REMAT_POLICIES
from jaxmem.program.train import build_train_program

TPU_OK, TPU_WHY = tpu_compiler_available()
GPU_OK, GPU_WHY = gpu_compiler_available("h100")
needs_tpu = pytest.mark.skipif(not TPU_OK, reason=f"TPU compiler unavailable: {TPU_WHY}")
needs_gpu = pytest.mark.skipif(not GPU_OK, reason=f"GPU compiler unavailable: {GPU_WHY}")
needs_cudnn = pytest.mark.skipif(
    cudnn_version() is None, reason="cuDNN not installed (the cuda extra): needed to trace"
)

# Long enough that dot's T x T scores dominate a tiny model's temporaries (4 heads x 2048^2
# bf16 scores are 32 MiB per sequence and layer, against 0.25 MiB of [T, d_model] activations).
LONG = dict(model="tiny", seq=2048, remat="none")


def _by_attention(rows):
  return {r.attention: r for r in rows}


# --- the target's kernel, by default -----------------------------------------------------------


def test_cpu_rows_name_chunked_by_default():
  (row,) = sweep.compare(model="tiny", batch=2, seq=32, target="cpu", remat="none")
  assert row.attention == "chunked" and row.error is None
  assert row.microbatches == 1 and row.vocab_tiles == 1
  assert not any(n.startswith("attention") for n in row.notes)  # chunked is CPU's choice, not a fallback


@pytest.fixture(scope="module")
def tpu_rows():
  return _by_attention(sweep.compare(**LONG, batch=4, target="tpu:v5p-8", attention="dot,auto"))


@pytest.mark.slow  # two TPU compiles (dot, splash); tests/test_attention.py compiles splash for a TPU
@needs_tpu
def test_tpu_default_is_splash_and_under_half_of_dot(tpu_rows):
  assert set(tpu_rows) == {"dot", "splash"}  # auto resolved to the TPU's kernel, and the row says so
  splash, dot = tpu_rows["splash"], tpu_rows["dot"]
  assert splash.temp_size_in_bytes < dot.temp_size_in_bytes / 2, (splash.temp_size_in_bytes, dot.temp_size_in_bytes)
  assert splash.argument_size_in_bytes == dot.argument_size_in_bytes  # attention moves temporaries only
  assert KERNEL_FLOPS_NOTE in splash.notes and KERNEL_FLOPS_NOTE not in dot.notes
  # The kernel's FLOPs are counted (not 0, not one grid step of 16): a causal kernel does about
  # half of dot's attention products (plus its backward's recomputation), so the step's FLOPs
  # fall, but not by a grid's factor.
  assert dot.flops / 4 < splash.flops < dot.flops


@needs_tpu
def test_auto_falls_back_to_chunked_with_the_reason():
  """Splash takes sequences of whole 128-lane blocks; auto says why it used chunked instead."""
  p = plan(model="tiny", batch=4, seq=96, target="tpu:v5p-8", remat="none")
  mesh, opt, rp = p.configs()[0]
  program = build_train_program(p.cfg, remat=rp, optimizer=opt, batch=4, seq=96, target=p.target, mesh=mesh)
  assert program.attention.name == "chunked"
  assert any("attention auto: splash needs a sequence length that is a multiple of 128" in n for n in program.notes)


@pytest.fixture(scope="module")
def gpu_rows():
  return _by_attention(sweep.compare(**LONG, batch=1, target="gpu:h100", attention="dot,auto,triton"))


@pytest.mark.slow  # three deviceless GPU compiles (dot, cudnn, triton); tests/test_attention.py compiles the kernels for an H100
@needs_gpu
@needs_cudnn
def test_gpu_default_is_cudnn_and_kernels_under_half_of_dot(gpu_rows):
  assert set(gpu_rows) == {"dot", "cudnn", "triton"}
  dot = gpu_rows["dot"].temp_size_in_bytes
  for name in ("cudnn", "triton"):
    assert gpu_rows[name].temp_size_in_bytes < dot / 2, (name, gpu_rows[name].temp_size_in_bytes, dot)
    assert gpu_rows["dot"].flops / 4 < gpu_rows[name].flops < gpu_rows["dot"].flops, name
  assert CUDNN_WORKSPACE_NOTE in gpu_rows["cudnn"].notes  # deviceless: the workspace is not in the figure
  assert CUDNN_WORKSPACE_NOTE not in gpu_rows["triton"].notes


# Slow (two GPU compiles of about 17 s each on 2 cores): the cuDNN kernel's shard_map specs over
# every batch and head axis are traced in the fast suite (test_mesh_axes.py).
@pytest.mark.slow
@needs_gpu
@needs_cudnn
def test_cudnn_under_shard_map_over_data_fsdp_and_tensor():
  rows = _by_attention(
      sweep.compare(**LONG, batch=4, target="gpu:h100x8", mesh="data=2,fsdp=2,tensor=2", attention="dot,cudnn")
  )
  assert rows["cudnn"].error is None and rows["cudnn"].temp_size_in_bytes < rows["dot"].temp_size_in_bytes / 2


# --- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--target", "cpu", "--attention", "splash"], "attention 'splash' cannot be used here: splash runs on TPU"),
        (["--target", "cpu", "--attention", "cudnn,dot"], "use one of auto, dot, chunked"),
        (["--target", "cpu", "--attention", "flash"], "unknown --attention 'flash'"),
        (["--target", "cpu", "--batch", "6", "--microbatches", "4"], "not divisible by 4 microbatches"),
        (["--target", "cpu", "--microbatches", "0"], "at least 1"),
        (["--target", "cpu", "--seq", "128", "--vocab-tiles", "3"], "divisor of the sequence length 128"),
        (["--target", "cpu", "--qk-dtype", "float16"], "unknown --qk-dtype"),
    ],
)
def test_bad_step_input_is_one_line_exit_2(argv, match, capsys):
  assert main(["compare", "--model", "tiny", "--batch", "8", *argv]) == 2
  err = capsys.readouterr().err
  assert match in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@needs_tpu
def test_splash_refuses_a_sequence_axis_in_one_line(capsys):
  argv = ["compare", "--model", "tiny", "--target", "tpu:v5p-8", "--mesh", "sequence=2,fsdp=2", "--seq", "256"]
  assert main([*argv, "--batch", "2", "--attention", "splash"]) == 2
  err = capsys.readouterr().err
  assert "splits the sequence 2 ways" in err and "use one of auto, dot, chunked" in err
  assert len(err.strip().splitlines()) == 1


# --- gradient accumulation ---------------------------------------------------------------------


def test_microbatches_lower_temp_at_a_fixed_global_batch():
  work = dict(model="tiny", batch=8, seq=64, target="cpu", remat="none")
  rows = {r.microbatches: r for r in sweep.compare(**work, microbatches="1,4")}
  one, four = rows[1], rows[4]
  assert four.temp_size_in_bytes < one.temp_size_in_bytes, (four.temp_size_in_bytes, one.temp_size_in_bytes)
  assert four.argument_size_in_bytes == one.argument_size_in_bytes and four.batch == one.batch == 8
  # The same work: four microbatches of 2 sequences compute what one batch of 8 does.
  assert four.flops == pytest.approx(one.flops, rel=0.02)


def test_accumulated_gradient_is_the_full_batch_gradient():
  """Run for real on CPU: one SGD step over 4 microbatches moves the parameters as one step over
  the whole batch does (same loss, same update up to float32 summation order)."""
  p = plan(model=get_config("tiny", dtype="float32"), batch=8, seq=16, target="cpu", remat="none", optimizer="sgd")
  mesh, opt, rp = p.configs()[0]

  def step(microbatches):
    program = build_train_program(
        p.cfg, remat=rp, optimizer=opt, batch=8, seq=16, target=p.target, mesh=mesh,
        options={"attention": "dot", "microbatches": microbatches},
    )
    params, state, tokens, targets = program.concrete_args(seed=3)
    before = [np.asarray(x) for x in jax.tree.leaves(params)]  # copied: the step donates params
    new_params, _, loss = program.step(params, state, tokens, targets)
    return float(loss), [np.asarray(a) - b for a, b in zip(jax.tree.leaves(new_params), before, strict=True)]

  (loss1, update1), (loss4, update4) = step(1), step(4)
  assert loss4 == pytest.approx(loss1, rel=1e-5)
  assert any(np.abs(u).max() > 0 for u in update1)
  for a, b in zip(update1, update4, strict=True):
    # Float32 sums in another order: equal to a few parts in 1e4 of each parameter's update scale.
    assert np.abs(b - a).max() <= 1e-3 * np.abs(a).max(), (np.abs(b - a).max(), np.abs(a).max())


# --- vocabulary tiling -------------------------------------------------------------------------


@pytest.mark.slow  # two compiles of a 1B model; tests/test_cli_io.py sweeps vocabulary tiles on tiny
@needs_gpu
def test_vocab_tiles_lower_temp_for_llama3_1b_at_seq_4096(compile_one):
  """llama3-1b's 128,256-token vocabulary at 4096 tokens: float32 logits of 2.1 GB, and their
  gradient. Two layers instead of 16 keep the compile short (the head is what tiling changes);
  benchmarks/attention_step.py shows the whole model."""
  cfg = get_config("llama3-1b", num_layers=2)
  work = dict(model=cfg, batch=1, seq=4096, target="gpu:h100", remat="full", optimizer="sgd")
  untiled, tiled = compile_one(**work), compile_one(**work, vocab_tiles=8)
  logits = 4096 * cfg.vocab_size * 4
  assert tiled.vocab_tiles == 8 and untiled.vocab_tiles == 1
  saved = untiled.temp_size_in_bytes - tiled.temp_size_in_bytes
  assert saved > logits, (untiled.temp_size_in_bytes, tiled.temp_size_in_bytes)


# --- MaxText's minimal remat -------------------------------------------------------------------


def _names(policy_residuals):
  return {r.name for r in policy_residuals.residuals}


def test_minimal_saves_every_projection_and_not_the_context():
  """MaxText's minimal saves q/k/v, the output projection and both SwiGLU input projections
  (before the activation); minimal_with_context adds the attention output."""
  by = {
      p.remat: p for p in saved_residuals_by_policy(
          model="tiny", batch=2, seq=32, target="cpu", attention="dot", remat="minimal,minimal_with_context,full"
      )
  }
  projections = {"query_proj", "key_proj", "value_proj", "out_proj", "mlpwi_0", "mlpwi_1"}
  assert projections <= _names(by["minimal"]), _names(by["minimal"])
  assert not {"context", "mlpwi"} & _names(by["minimal"])  # jaxmem's mlpwi is after the activation
  assert _names(by["minimal_with_context"]) - _names(by["minimal"]) == {"context"}
  assert by["full"].per_layer_bytes < by["minimal"].per_layer_bytes < by["minimal_with_context"].per_layer_bytes
  # The routed experts' projections too (MaxText tags them with both names; jaxmem's with moe_ only).
  saves = ("query_proj", "key_proj", "value_proj", "out_proj", "mlpwi_0", "mlpwi_1", "mlpwo", "moe_mlpwi_0",
           "moe_mlpwi_1", "moe_mlpwo")
  assert REMAT_POLICIES["minimal"].saves == saves


def test_gpt2_minimal_saves_its_one_mlp_input_projection():
  listed = saved_residuals_by_policy(model="tiny-gpt2", batch=2, seq=32, target="cpu", attention="dot", remat="minimal")
  (p,) = [x for x in listed if x.remat == "minimal"]
  assert {"mlpwi_0", "query_proj", "out_proj"} <= _names(p) and "mlpwi_1" not in _names(p)


def test_compare_residuals_lists_each_attention(capsys):
  argv = ["compare", "--model", "tiny", "--batch", "2", "--seq", "128", "--target", "cpu", "--residuals"]
  assert main([*argv, "--remat", "minimal", "--attention", "dot,chunked", "--format", "json"]) == 0
  doc = json.loads(capsys.readouterr().out)
  assert {r["attention"] for r in doc["rows"]} == {"dot", "chunked"}
  # dot saves its T x T softmax when nothing is rematerialised; chunked keeps only its output
  # and log-sum-exp (named context).
  none = {
      a: sum(r["bytes"] for r in doc["rows"] if r["remat"] == "none" and r["attention"] == a) for a in ("dot", "chunked")
  }
  assert none["chunked"] < none["dot"], none


# --- infer: prefill through the kernel, decode through the cache -------------------------------


def test_infer_prefill_takes_the_attention_decode_says_it_keeps_einsums():
  rows = infer(model="tiny", prompt=32, context=64, target="cpu", attention="chunked")
  prefill, decode = (next(r for r in rows if r.phase == ph) for ph in ("prefill", "decode"))
  assert prefill.attention == "chunked" and prefill.error is None
  assert decode.attention == "dot" and any("decode attends one token" in n for n in decode.notes)


def test_rows_round_trip_the_step_fields():
  row = sweep.Row(
      model="m", target="t", mesh="fsdp=1", batch=1, num_devices=1, remat="none", optimizer="sgd", seq=1,
      param_dtype="float32", dtype="bfloat16", attention="splash", microbatches=4, vocab_tiles=2,
  )
  back = sweep.row_from_dict(row.as_dict())
  assert back == row and back.as_dict()["attention"] == "splash"
  assert sweep.baseline_key(row) != sweep.baseline_key(dataclasses.replace(row, attention="dot"))
  assert jnp.dtype(row.qk_dtype) == jnp.bfloat16
