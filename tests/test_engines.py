"""Serving engines' capacity rules (jaxmem.inference.engines, --engine, --emit): vLLM's pages and
blocks as its sources lay them out, its budget from the compiled terms, JetStream's slots from the
compiled decode fit, the launches vLLM's parser accepts, and every new flag's bad input in one line.
Compiles are of ``tiny`` on one device, small shapes; the published cases are benchmarks/serving.py."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import pytest

import jaxmem
from jaxmem.cli import main
from jaxmem.errors import JaxmemError
from jaxmem.hardware.gpu import GPU_SPECS
from jaxmem.hardware.targets import get_target, target_peaks
from jaxmem.inference import engines, serving
from jaxmem.inference.engines import vllm
from jaxmem.inference.kv import KV_CACHE_DTYPES
from jaxmem.models import get_config

DATA = Path(__file__).parent / "data"


def _small(name: str, capacity: int):
  """A target whose capacity a tiny model fills at a few sequences, so every compile stays small."""
  return dataclasses.replace(jaxmem.target(name), capacity_bytes=capacity, capacity_note="a test's capacity")


# --- vLLM's page geometry and defaults: arithmetic only, no compile --------------------------------


def test_the_tpu_kernels_page_halves_the_blocks_as_tpu_inference_pr_757_logged():
  # Llama 3.1 70B, TP 8, fp8 KV, block 128: vLLM's page 262,144 B, the kernel's 524,288 B (one kv
  # head a device: k and v are two fp8 values in a 32-bit word of four). A budget vLLM counts as
  # 8,676 blocks is 4,338 of the kernel's.
  geo = vllm.geometry(get_config("llama3-70b"), 8, KV_CACHE_DTYPES["fp8"], "tpu")
  assert geo.spec_page(128) == 262_144 and geo.kernel_page(128) == 524_288
  budget = 8676 * geo.spec_page(128) * geo.layers
  assert budget // geo.spec_page(128) // geo.layers == 8676
  assert budget // geo.kernel_page(128) // geo.layers == 4338


def test_no_padding_where_a_device_fills_its_words_and_none_on_gpu():
  for model, tp, kv in (("llama3-8b", 4, "bf16"), ("llama3-8b", 2, "fp8"), ("llama3-70b", 8, "bf16")):
    geo = vllm.geometry(get_config(model), tp, KV_CACHE_DTYPES[kv], "tpu")
    assert geo.kernel_page(256) == geo.spec_page(256), (model, tp, kv)
  geo = vllm.geometry(get_config("llama3-70b"), 8, KV_CACHE_DTYPES["fp8"], "gpu")
  assert geo.kernel_page(16) == geo.spec_page(16) == 2 * 16 * 8 * 128  # the whole engine, a layer


def test_the_tpu_block_size_follows_max_model_len_and_the_smem_block_table():
  assert vllm.tpu_block_size(4096, 256) == 256  # PR #145's 256 at max_model_len 4096
  assert vllm.tpu_block_size(2048, 256) == 128
  assert vllm.tpu_block_size(100, 256) == 16
  assert vllm.tpu_block_size(16384, 64) == 16  # past 8192: 16
  # The block table must fit half of SMEM: 1,024 requests of 16,384 tokens need 128-token pages,
  # 256 of 131,072 tokens 256-token ones.
  assert vllm.tpu_block_size(16384, 1024) == 128
  assert vllm.tpu_block_size(131072, 256) == 256


def test_vllm_serves_batch_defaults_by_device():
  assert vllm.batch_defaults(get_target("gpu:h100")) == (8192, 1024)
  assert vllm.batch_defaults(get_target("gpu:a100-80gb")) == (2048, 256)  # an A100 keeps the small defaults
  assert vllm.batch_defaults(get_target("gpu:l4")) == (2048, 256)
  assert vllm.batch_defaults(get_target("tpu:v6e-4")) == (1024, 256)


# --- vLLM's budget from the compiled terms ---------------------------------------------------------


@pytest.fixture(scope="module")
def tpu_answers():
  """vLLM on a v5e chip of 4 MiB at two utilizations, and the same asked 3 sequences."""
  t = _small("tpu:v5e-1", 4 << 20)
  run = dict(model="tiny", target=t, context=128, max_num_batched_tokens=64)
  (hi,) = engines.engine_capacity(engine="vllm", **run)
  (lo,) = engines.engine_capacity(engine="vllm", gpu_memory_utilization=0.5, **run)
  return t, hi, lo


@pytest.mark.needs_tpu_compiler
def test_tpu_budget_is_the_utilization_of_the_limit_less_the_compiled_weights(tpu_answers):
  t, hi, lo = tpu_answers
  weights = hi.row.weight_bytes_per_device
  assert hi.term("weights").bytes == weights and hi.term("weights").origin == engines.COMPILER
  assert hi.kv_bytes == int(t.capacity_bytes * 0.9 - weights)
  assert hi.kv_bytes - lo.kv_bytes == pytest.approx(0.4 * t.capacity_bytes, abs=2)
  layers = get_config("tiny").num_layers
  assert hi.num_blocks == hi.kv_bytes // hi.kernel_page_bytes // layers
  assert hi.kv_tokens == hi.num_blocks * hi.block_size
  # The most sequences: every one a whole context's blocks, one more does not fit.
  per_seq = math.ceil(hi.context / hi.block_size)
  assert hi.max_seqs * per_seq <= hi.num_blocks < (hi.max_seqs + 1) * per_seq
  # Headroom: the forward pass's temporaries and code within what the cap leaves.
  # tiny's program takes a fifth of this 4 MiB device: it loads at 0.5, not at 0.9.
  reservation = hi.term("program reservation").bytes
  assert reservation == hi.row.temp_size_in_bytes + hi.row.generated_code_size_in_bytes
  assert (1 - hi.max_utilization) * t.capacity_bytes >= reservation > (1 - hi.max_utilization - 0.002) * t.capacity_bytes
  assert lo.max_utilization == hi.max_utilization and lo.loads and not hi.loads


@pytest.mark.needs_tpu_compiler
def test_the_pairs_trade_context_for_sequences_and_each_fits(tpu_answers):
  _, hi, _ = tpu_answers
  contexts = [c for c, _ in hi.pairs]
  seqs = [n for _, n in hi.pairs]
  assert contexts == sorted(contexts) and seqs == sorted(seqs, reverse=True)
  geo = vllm.geometry(get_config("tiny"), 1, KV_CACHE_DTYPES["bf16"], "tpu")
  for ctx, n in hi.pairs:  # n sequences of ctx tokens, each its whole context's blocks, within the budget
    block = vllm.tpu_block_size(ctx, 256)
    assert n * math.ceil(ctx / block) * geo.kernel_page(block) * geo.layers <= hi.kv_bytes


@pytest.mark.needs_tpu_compiler
def test_asking_for_more_sequences_than_fit_says_no(tpu_answers):
  t, hi, _ = tpu_answers
  run = dict(model="tiny", target=t, context=128, max_num_batched_tokens=64)
  (yes,) = engines.engine_capacity(engine="vllm", batch=hi.max_seqs, **run)
  (no,) = engines.engine_capacity(engine="vllm", batch=hi.max_seqs + 1, **run)
  assert yes.fits and not no.fits and yes.max_seqs == hi.max_seqs


@pytest.mark.needs_gpu_compiler("l4")
def test_gpu_budget_subtracts_the_compiled_forward_pass_and_the_sampler():
  (r,) = engines.engine_capacity(engine="vllm", model="tiny", target="gpu:l4", context=256, batch=4,
                                 max_num_batched_tokens=128)
  t = get_target("gpu:l4")
  terms = {x.name: x for x in r.terms}
  assert terms["peak activation"].bytes == r.row.temp_size_in_bytes and terms["peak activation"].origin == engines.COMPILER
  assert terms["sampler logits"].bytes == 4 * get_config("tiny").vocab_size * 4  # min(4 seqs, 128 tokens) float32 rows
  assert terms["non-torch memory"].bytes is None and terms["non-torch memory"].origin == engines.UNMODELLED
  used = terms["weights"].bytes + terms["peak activation"].bytes + terms["sampler logits"].bytes
  assert r.kv_bytes == int(t.hbm_bytes * 0.9 - used)
  assert r.block_size == vllm.GPU_BLOCK_SIZE and r.max_utilization is None


# --- JetStream ---------------------------------------------------------------------------------------


@pytest.mark.needs_tpu_compiler
def test_jetstream_slots_are_the_decode_fits_answer_and_the_prefill_fits_beside_them():
  t = _small("tpu:v5e-1", 3 << 19)
  (r,) = engines.engine_capacity(engine="jetstream", model="tiny", target=t, context=128, max_prefill_length=32)
  (fit,) = serving.fit_serving(model="tiny", target=t, mesh="tensor=1", context=128)
  assert r.max_seqs == fit.max_batch and r.fits
  assert r.settings["per_device_batch_size"] == r.max_seqs and r.settings["max_target_length"] == 128
  state = r.term("decode state").bytes
  assert state == r.row.kv_cache_bytes_per_device and r.term("prefill program").origin == engines.COMPILER


# --- launches ----------------------------------------------------------------------------------------


def _vllm_parser() -> tuple[argparse.ArgumentParser, dict]:
  """vLLM's serve parser for the flags --emit writes, from its documented flag list (test data)."""
  spec = json.loads((DATA / "vllm" / "serve_flags.json").read_text())

  class Refuse(argparse.ArgumentParser):
    def error(self, message):
      raise ValueError(message)

  p = Refuse(prog="vllm serve")
  p.add_argument(spec["positional"])
  for flag, f in spec["flags"].items():
    p.add_argument(flag, *f.get("aliases", []), type={"int": int, "float": float, "str": str}[f["type"]],
                   choices=f.get("choices"))
  return p, spec


def _launch_is_accepted(argv: tuple[str, ...]) -> None:
  assert argv[:2] == ("vllm", "serve")
  p, spec = _vllm_parser()
  ns = vars(p.parse_args(list(argv[2:])))
  for flag, f in spec["flags"].items():
    v = ns[flag.lstrip("-").replace("-", "_")]
    assert v is not None, f"{flag} not written"
    assert "gt" not in f or v > f["gt"]
    assert "le" not in f or v <= f["le"]
  assert ns["max_num_batched_tokens"] >= ns["max_num_seqs"]  # SchedulerConfig's relation


def test_the_parser_built_from_vllms_flag_list_refuses_what_vllm_refuses():
  p, _ = _vllm_parser()
  with pytest.raises(ValueError, match="invalid choice"):
    p.parse_args(["m", "--kv-cache-dtype", "int8"])
  with pytest.raises(ValueError, match="unrecognized|invalid"):
    p.parse_args(["m", "--max-model-length", "8"])


@pytest.mark.needs_tpu_compiler
def test_emit_vllm_writes_flags_vllms_parser_accepts(tpu_answers):
  _, hi, lo = tpu_answers
  for r in (hi, lo):
    launch = jaxmem.emitters(jaxmem.ENGINE_EMITTERS)["vllm"](r)
    _launch_is_accepted(launch.argv)
    assert launch.argv[launch.argv.index("--max-num-seqs") + 1] == str(r.max_seqs)
    assert launch.argv[launch.argv.index("--gpu-memory-utilization") + 1] == f"{r.settings['gpu_memory_utilization']:g}"


def test_emit_refuses_another_engines_answer_and_a_result_of_another_kind(tpu_answers):
  _, hi, _ = tpu_answers
  registry = jaxmem.emitters(jaxmem.ENGINE_EMITTERS)
  with pytest.raises(JaxmemError, match="`emit` jetstream writes a JetStream capacity"):
    registry["jetstream"](hi)
  with pytest.raises(JaxmemError, match="`emit` vllm writes a vLLM capacity"):
    registry["vllm"]("a plan's result")
  with pytest.raises(JaxmemError, match="two emitters are named 'vllm'"):
    jaxmem.emitters(jaxmem.ENGINE_EMITTERS, jaxmem.ENGINE_EMITTERS[:1])


def test_one_emit_registry_serves_every_command_and_each_refuses_the_others_writer(capsys):
  # plan's --emit and the engines' choose from one registry, each the writers of its own result.
  assert set(jaxmem.EMITTERS) == {"maxtext", *jaxmem.ENGINES}
  assert jaxmem.taking(jaxmem.EMITTERS, jaxmem.PlanResult) == ("maxtext",)
  assert set(jaxmem.taking(jaxmem.EMITTERS, jaxmem.EngineCapacity)) == set(jaxmem.ENGINES)
  with pytest.raises(JaxmemError, match="`emit` maxtext writes a plan's recommendation"):
    jaxmem.EMITTERS["maxtext"]("an engine's answer")
  # Refused in one line before anything compiles (no target is resolved for a bad name either).
  assert main(["infer", "--model", "tiny", "--engine", "vllm", "--emit", "maxtext"]) == 2
  assert "--emit maxtext writes a plan's recommendation" in capsys.readouterr().err
  assert main(["plan", "--model", "tiny", "--emit", "vllm"]) == 2
  assert "invalid choice: 'vllm' (choose from 'maxtext')" in capsys.readouterr().err


# --- the GPUs teams rent for serving ---------------------------------------------------------------


def test_the_pcie_parts_have_their_published_figures_and_no_nvlink():
  # The totals nvidia-smi reports (23034, 46068 and 23028 MiB); sm_89 and sm_86, which the CUDA
  # plugin compiles for (tests/test_accelerators.py compiles a program for every part).
  for name, cc, mib in (("l4", (8, 9), 23034), ("l40s", (8, 9), 46068), ("a10g", (8, 6), 23028)):
    t = get_target(f"gpu:{name}x8")
    assert t.hbm_bytes == mib * 2**20 and GPU_SPECS[name].compute_capability == cc
    assert t.kind.nvlink_bandwidth() is None and t.kind.host().accelerators == 8
    peaks, why = target_peaks(t)
    if name == "a10g":  # NVIDIA publishes no A10G datasheet: no peaks, and the reason
      assert peaks is None and "no published peak" in why
    else:
      assert peaks.link == "PCIe" and peaks.peak_8bit_ops >= 2 * peaks.peak_flops


def test_a_kv_cache_dtype_stores_the_cache_in_its_bytes():
  rows = {kv: jaxmem.infer(model="tiny", target="cpu", phase="decode", context=64, kv_cache_dtype=kv)[0]
          for kv in ("bf16", "fp8", "int4")}
  assert rows["fp8"].kv_cache_bytes_per_device * 2 == rows["bf16"].kv_cache_bytes_per_device
  assert rows["int4"].kv_cache_bytes_per_device * 4 == rows["bf16"].kv_cache_bytes_per_device
  assert [rows[k].kv_cache_dtype for k in rows] == ["bf16", "fp8", "int4"]
  assert rows["fp8"].kv_cache_bytes_per_token * 2 == rows["bf16"].kv_cache_bytes_per_token
  # infer's table shows the stored dtype where it is not the compute dtype's (a column of the registry).
  from jaxmem.render.inference import render_infer

  assert "kv dtype" not in render_infer([rows["bf16"]], "table")
  table = render_infer([rows["fp8"], rows["int4"]], "table")
  assert "kv dtype" in table and " fp8 " in table and " int4 " in table


# --- bad input: one line, exit 2, before any compile --------------------------------------------------


@pytest.mark.parametrize("argv,message", [
    (["infer", "--engine", "nope"], "--engine must be one of vllm, jetstream, got 'nope'"),
    (["infer", "--kv-cache-dtype", "nope"], "--kv-cache-dtype must be one of"),
    (["infer", "--engine", "vllm", "--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization must be a fraction"),
    (["infer", "--engine", "vllm", "--gpu-memory-utilization", "most"], "--gpu-memory-utilization must be a fraction in (0, 1]"),
    (["infer", "--engine", "vllm", "--block-size", "0"], "--block-size must be a whole number of at least 1"),
    (["infer", "--engine", "vllm", "--max-num-batched-tokens", "0"], "--max-num-batched-tokens must be a whole number of at least 1"),
    (["infer", "--engine", "jetstream", "--max-prefill-length", "0"], "--max-prefill-length must be a whole number of at least 1"),
    (["infer", "--engine", "vllm", "--max-prefill-length", "8"], "--max-prefill-length is not an engine vllm setting"),
    (["infer", "--block-size", "16"], "--block-size is a serving engine's: give --engine"),
    (["infer", "--emit", "vllm"], "--emit is a serving engine's: give --engine"),
    (["infer", "--engine", "vllm", "--emit", "nope"], "unknown launch 'nope'"),
    (["infer", "--engine", "vllm", "--emit", "jetstream"], "--emit jetstream writes engine jetstream's launch"),
    (["infer", "--engine", "vllm", "--emit", "vllm", "--format", "csv"], "--emit writes after the table"),
    (["infer", "--engine", "vllm", "--prompt", "64"], "--prompt does not apply with --engine vllm"),
    (["infer", "--engine", "vllm", "--kv-cache-dtype", "int8"], "keeps a scale a token and head"),
    (["infer", "--engine", "vllm", "--target", "cpu"], "engine vllm sizes a TPU's or a GPU's memory"),
    (["infer", "--engine", "vllm", "--target", "tpu:v5e-4", "--mesh", "data=4"], "engine vllm shards over tensor only"),
    (["infer", "--engine", "vllm", "--model", "tiny-mla"], "latent (MLA) cache"),
    (["fit", "--engine", "vllm"], "--engine is a serving fit's: give --phase"),
    (["fit", "--kv-cache-dtype", "fp8"], "--kv-cache-dtype is a serving fit's: give --phase"),
    (["fit", "--phase", "prefill", "--engine", "vllm"], "sizes a server for decode: give --phase decode"),
    (["fit", "--phase", "decode", "--engine", "vllm", "--over", "context", "--batch", "2"], "--over batch"),
])
def test_bad_input_is_one_line(argv, message, capsys, monkeypatch):
  monkeypatch.setattr(engines.base, "run_infer_config", _no_compile)
  defaults = ["--model", "tiny", "--target", "tpu:v5e-1"]
  given = {a for a in argv if a.startswith("--")}
  extra = [x for i in range(0, len(defaults), 2) if defaults[i] not in given for x in defaults[i:i + 2]]
  assert main([*argv, *extra]) == 2
  err = capsys.readouterr().err.strip()
  assert message in err and len(err.splitlines()) == 1, err


def _no_compile(*args, **kwargs):
  raise AssertionError("bad input reached a compile")
