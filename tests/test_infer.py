"""jaxmem.inference.infer and .quant: KV cache bytes, decode growth with context, quantized weight bytes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import jaxmem
from jaxmem.inference import infer, quant
from jaxmem.program import sharding as shd
from jaxmem.errors import JaxmemError
from jaxmem.models import KVCache, Transformer, get_config, kv_cache_bytes
from jaxmem.program.train import abstract_model


def test_kv_bytes_match_the_formula():
  for name in ("tiny", "tiny-gpt2", "llama3-8b", "llama3-405b"):
    cfg = get_config(name)
    c = KVCache.abstract(cfg, batch=3, context=96)
    assert c.k_lbksh.shape == (cfg.num_layers, 3, cfg.num_kv_heads, 96, cfg.head_dim) and c.context == 96
    formula = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 96 * 3 * 2
    assert kv_cache_bytes(cfg, batch=3, context=96) == formula
    assert 2 * c.k_lbksh.size * 2 == formula


def test_cached_decode_matches_the_full_forward():
  cfg = get_config("tiny", param_dtype="float32", dtype="float32")
  m = Transformer(cfg, rngs=nnx.Rngs(0))
  toks = jax.random.randint(jax.random.key(1), (2, 6), 0, cfg.vocab_size)
  full = m(toks)
  cache = KVCache.zeros(cfg, batch=2, context=8)
  _, cache = m.cached(toks[:, :5], cache, pos=0)
  last, _ = m.cached(toks[:, 5:6], cache, pos=5)
  assert jnp.allclose(last[:, 0], full[:, 5], atol=1e-5)
  # int8 weights through the hook: close to the float model.
  qparams = quant.quantize_params(nnx.state(m, nnx.Param), quant.WEIGHT_FORMATS["int8"])
  qm = nnx.merge(nnx.graphdef(m), qparams)
  qlast, _ = qm.cached(toks[:, 5:6], cache, pos=5, weights=quant.weight_hook(jnp.float32))
  assert jnp.abs(qlast[:, 0] - full[:, 5]).max() < 0.05 * jnp.abs(full[:, 5]).max() + 1e-3


def test_decode_argument_bytes_grow_by_the_kv_cache_growth_per_device():
  rows = infer.infer(model="tiny", phase="decode", context=[64, 128], batch=4, target="cpu:8", mesh="fsdp=4,tensor=2")
  a, b = rows
  assert b.kv_cache_bytes_per_device - a.kv_cache_bytes_per_device == (b.kv_cache_bytes - a.kv_cache_bytes) // 8
  assert b.argument_size_in_bytes - a.argument_size_in_bytes == b.kv_cache_bytes_per_device - a.kv_cache_bytes_per_device
  # The cache is donated: the new cache reuses its buffer.
  assert b.alias_size_in_bytes == b.kv_cache_bytes_per_device


@pytest.mark.needs_gpu_compiler("h100")
def test_gpu_decode_updates_the_cache_in_place():
  # With the kv heads after the positions, XLA's GPU layout assignment transposed the whole
  # donated cache into and out of the layer loop: temp grew by about the cache's own growth.
  # 16 layers, so that one layer's share of the cache is small next to the whole.
  cfg = get_config("tiny", num_layers=16)
  a, b = infer.infer(model=cfg, phase="decode", context=[2048, 4096], batch=8, target="gpu:h100")
  assert a.error is None and b.error is None
  assert b.alias_size_in_bytes == b.kv_cache_bytes_per_device
  # What remains is one layer's slice of the cache (a 1/num_layers share).
  assert b.temp_size_in_bytes - a.temp_size_in_bytes < 0.25 * (b.kv_cache_bytes - a.kv_cache_bytes)


def _stored(name, fmt):
  cfg = get_config(name, param_dtype="bfloat16")
  _, params, logical = abstract_model(cfg)
  mesh = jax.sharding.Mesh(jax.devices()[:1], ("fsdp",))
  sh = shd.param_shardings(params, logical, mesh)
  return quant.abstract_quantized(params, sh, quant.WEIGHT_FORMATS[fmt])[0]


def test_int4_and_fp8_weights_are_a_quarter_and_half_of_bf16_plus_scales():
  bf16, _ = quant.tree_stored_bytes(_stored("llama3-8b", "bf16"))
  for fmt, frac in (("fp8", 0.5), ("int8", 0.5), ("int4", 0.25)):
    stored = _stored("llama3-8b", fmt)
    q_bytes = sum(quant.stored_bytes(l.q.shape, l.q.dtype) for l in jax.tree.leaves(stored, is_leaf=quant.is_qtensor) if quant.is_qtensor(l))
    bf16_of_quantized = sum(2 * l.q.size for l in jax.tree.leaves(stored, is_leaf=quant.is_qtensor) if quant.is_qtensor(l))
    assert q_bytes == frac * bf16_of_quantized  # exactly
    values, scales = quant.tree_stored_bytes(stored)
    assert 0 < scales < 0.001 * bf16
    assert (values + scales) / bf16 == pytest.approx(frac, rel=0.01)


def test_compiler_argument_bytes_per_weight_format():
  rows = infer.infer(model="tiny", phase="decode", weights="bf16,int8,int4", context=64, batch=2, target="cpu")
  by = {r.weights: r for r in rows}
  # The compiler's arguments differ exactly by the stored weight bytes (int4 packed two per byte).
  for f in ("int8", "int4"):
    assert by["bf16"].argument_size_in_bytes - by[f].argument_size_in_bytes == by["bf16"].weight_bytes - by[f].weight_bytes


def test_bad_input_is_one_line():
  with pytest.raises(JaxmemError, match="unknown weight format"):
    infer.plan_infer(model="tiny", weights="int3")
  with pytest.raises(JaxmemError, match="not divisible"):
    infer.plan_infer(model="tiny", batch=3, target="cpu:2", mesh="fsdp=2")
  with pytest.raises(JaxmemError, match="unknown phase"):
    infer.plan_infer(model="tiny", phase="train")


def test_training_vs_inference_and_plot(tmp_path):
  side = infer.training_vs_inference(model="tiny", target="cpu", batch=2, seq=32, remat="full")
  assert [w.workload for w in side] == ["train", "decode"]
  assert all(w.required_bytes and w.all_devices_required_bytes == w.required_bytes for w in side)
  rows = infer.infer(model="tiny", phase="decode", context=[32, 64], batch=1, target="cpu")
  kv = infer.kv_cache_table("tiny", contexts=[32, 64], batches=[1, 2])
  assert kv[-1]["kv_cache_bytes"] == kv_cache_bytes(get_config("tiny"), batch=2, context=64)
  path = jaxmem.plot_inference(rows, str(tmp_path / "kv.png"), kv_rows=kv)
  assert (tmp_path / "kv.png").stat().st_size > 0 and path.endswith("kv.png")


def test_infer_and_estimate_parsers(capsys):
  import json

  from jaxmem import cli

  parser = cli.build_parser()
  args = parser.parse_args(["infer", "--model", "tiny", "--target", "cpu", "--phase", "decode", "--context", "32,64", "--weights", "int4", "--format", "json"])
  assert args.func(args) == 0
  rows = json.loads(capsys.readouterr().out)["rows"]
  assert [(r["phase"], r["weights"], r["context"]) for r in rows] == [("decode", "int4", 32), ("decode", "int4", 64)]
  a, b = rows
  # The flags reached the compile: the longer context's argument grows by its cache's growth.
  assert b["argument_size_in_bytes"] - a["argument_size_in_bytes"] == b["kv_cache_bytes"] - a["kv_cache_bytes"] > 0
  args = parser.parse_args(["estimate", "--model", "llama3-405b"])
  assert args.func(args) == 0
  out = capsys.readouterr().out
  # The closed forms, from the preset's shapes: 811.71 GB of bf16 weights, 81.2 H100s of state.
  assert "811.71" in out and "81.2" in out
