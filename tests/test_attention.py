"""Attention implementations (dot, chunked, splash, cudnn, triton), the registry and auto choice,
vocabulary-tiled loss, and prefill through ``attend``.

Numerics run on CPU: chunked natively, splash and triton in Pallas' interpreter
(``interpret=True``), cuDNN's wrapper through ``jax.nn.dot_product_attention``'s XLA path (cuDNN
itself needs a GPU to run). Memory runs through the real TPU and GPU compilers without the
hardware, and asserts relationships (a kernel's temp far below dot's), never byte counts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxmem.errors import JaxmemError
from jaxmem.models import (
  ATTENTION_NAMES,
  IMPLEMENTATIONS,
  AttentionShapes,
  KVCache,
  Transformer,
  attention_help,
  choose_attention,
  chunked_attend,
  cross_entropy,
  dot_attend,
  get_attention,
  get_config,
)
from jaxmem.models import attention_kernels as kernels
from jaxmem.models.attention_ops import Local
from jaxmem.program.sharding import mesh_axes

from jaxmem.hardware.gpu import gpu_compiler_available
from jaxmem.hardware.tpu import tpu_compiler_available
from jaxmem.hardware import targets as tg

TPU_OK, TPU_WHY = tpu_compiler_available()
GPU_OK, GPU_WHY = gpu_compiler_available("h100")
needs_tpu = pytest.mark.skipif(not TPU_OK, reason=f"TPU compiler unavailable: {TPU_WHY}")
needs_gpu = pytest.mark.skipif(not GPU_OK, reason=f"GPU compiler unavailable: {GPU_WHY}")

# (B, T, N, K, H): multi-head and grouped-query. T = 128 is the smallest sequence every kernel
# takes (splash's and triton's blocks are 128 wide), so the interpreted kernels stay fast.
MHA = (1, 128, 2, 2, 16)
GQA = (1, 128, 4, 2, 16)


def qkv(shape, dtype=jnp.bfloat16, seed=0):
  b, t, n, k, h = shape
  kq, kk, kv, kw = jax.random.split(jax.random.key(seed), 4)
  return (
    jax.random.normal(kq, (b, t, n, h), jnp.float32).astype(dtype),
    jax.random.normal(kk, (b, t, k, h), jnp.float32).astype(dtype),
    jax.random.normal(kv, (b, t, k, h), jnp.float32).astype(dtype),
    jax.random.normal(kw, (b, t, n, h), jnp.float32),  # a cotangent that weights every output
  )


def assert_bf16_close(got, want, what):
  # bf16 keeps 8 bits of mantissa: outputs and gradients rounded to it differ from a float32
  # reference by a few parts in 1e3 of their scale.
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  scale = float(np.abs(want).max())
  err = float(np.abs(got - want).max())
  assert err <= 2e-2 * scale, (what, err, scale)


def output_and_grads(attend, q, k, v, w):
  """attend's output and the gradients of sum(output * w) w.r.t. q, k, v: one compile."""
  out, vjp = jax.vjp(lambda q, k, v: attend(q, k, v, causal=True), q, k, v)
  return out, vjp(w.astype(out.dtype))


@functools.lru_cache(maxsize=None)
def reference(shape):
  """dot attention in float32 on the same (bf16-rounded) inputs, once per shape."""
  q, k, v, w = qkv(shape)
  up = lambda x: x.astype(jnp.float32)  # noqa: E731
  f32_dot = functools.partial(dot_attend, scores_dtype=jnp.float32)
  return jax.jit(functools.partial(output_and_grads, f32_dot))(up(q), up(k), up(v), w)


def run_against_dot(attend, shape):
  q, k, v, w = qkv(shape)
  got_out, grads = jax.jit(functools.partial(output_and_grads, attend))(q, k, v, w)
  want_out, want_grads = reference(shape)
  assert got_out.shape == want_out.shape and got_out.dtype == v.dtype
  assert_bf16_close(got_out, want_out, "output")
  for name, g, gw in zip("qkv", grads, want_grads, strict=True):
    assert g.shape == gw.shape and g.dtype == q.dtype, name
    assert_bf16_close(g, gw, f"d{name}")


# --- each implementation against dot ---------------------------------------------------------

IMPLS = {
  "dot-bf16": dot_attend,
  "chunked": functools.partial(chunked_attend, block_q=32, block_kv=64),  # several blocks
  "splash": kernels.make_splash_attend(interpret=True),
  "triton": kernels.make_triton_attend(interpret=True),
  # cuDNN cannot run on a CPU: its wrapper's layout, scale and GQA go through XLA's path.
  "cudnn-wrapper": kernels.make_cudnn_attend(implementation="xla"),
}


@pytest.mark.parametrize("shape", [MHA, GQA], ids=["mha", "gqa"])
@pytest.mark.parametrize("name", list(IMPLS))
def test_forward_and_gradients_match_dot(name, shape):
  run_against_dot(IMPLS[name], shape)


@pytest.mark.parametrize("layer", [{}, {"local": Local(10)}, {"local": Local(10, chunked=True)}, {"softcap": 3.0}],
                         ids=["global", "sliding", "chunked-window", "softcap"])
@pytest.mark.parametrize("with_sinks", [False, True], ids=["no-sinks", "sinks"])
def test_chunked_pads_sequences_that_are_not_a_multiple_of_the_block(layer, with_sinks):
  # T = 45 with blocks of 16: padded to 48, padded keys masked, padded queries dropped. v's
  # head size differs from q's (MLA shapes); GQA (N = 4 query heads on K = 2); float32 so any
  # slip shows. With GPT-OSS's sinks (one logit per query head, [N] -> [K, G]), the output and
  # every gradient, the sinks' included, are dot's; without them, chunked is dot without them.
  b, t, n, k, h, vd = 2, 45, 4, 2, 8, 6
  kq, kk, kv, ks = jax.random.split(jax.random.key(3), 4)
  q = jax.random.normal(kq, (b, t, n, h))
  kk_ = jax.random.normal(kk, (b, t, k, h))
  v = jax.random.normal(kv, (b, t, k, vd))
  w = jax.random.normal(jax.random.key(4), (b, t, n, vd))
  sinks = 2.0 * jax.random.normal(ks, (n,)) if with_sinks else None

  def output_and_all_grads(attend, *args):
    out, vjp = jax.vjp(lambda *a: attend(*a[:3], **({"sinks": a[3]} if with_sinks else {})), *args)
    return out, vjp(w.astype(out.dtype))

  @jax.jit
  def both(*args):
    return [
      output_and_all_grads(functools.partial(fn, causal=causal, **layer), *args)
      for causal in (True, False)
      for fn in (
        functools.partial(chunked_attend, block_q=16, block_kv=16),
        functools.partial(dot_attend, scores_dtype=jnp.float32),
      )
    ]

  results = both(q, kk_, v, *([sinks] if with_sinks else []))
  for (out, grads), (want, want_grads) in (results[:2], results[2:]):
    assert out.shape == (b, t, n, vd) and jnp.allclose(out, want, atol=1e-5)
    assert len(grads) == 3 + with_sinks
    for g, gw in zip(grads, want_grads, strict=True):
      assert jnp.allclose(g, gw, atol=1e-4)
  if with_sinks:  # the sinks change the output and have a gradient of their own
    no_sinks = chunked_attend(q, kk_, v, block_q=16, block_kv=16, **layer)
    assert not jnp.allclose(results[0][0], no_sinks, atol=1e-3)
    assert float(jnp.abs(results[0][1][3]).min()) > 0


def all_eqns(jaxpr):
  """Equations of a jaxpr and of every jaxpr nested in it (einsum is itself a jit)."""
  for eqn in jaxpr.eqns:
    yield eqn
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          yield from all_eqns(inner)


def test_dot_scores_in_the_compute_dtype_by_default_float32_on_request():
  q, k, v, _ = qkv(GQA)

  def score_dtypes(**kw):
    # The dot_general results with both a T and an S dimension (both 128 here; every other
    # dimension is smaller): the scores.
    jaxpr = jax.make_jaxpr(functools.partial(dot_attend, **kw))(q, k, v).jaxpr
    return {
      str(e.outvars[0].aval.dtype) for e in all_eqns(jaxpr)
      if e.primitive.name == "dot_general" and sorted(e.outvars[0].aval.shape)[-2:] == [128, 128]
    }

  assert score_dtypes() == {"bfloat16"}
  assert score_dtypes(scores_dtype=jnp.float32) == {"float32"}
  assert_bf16_close(dot_attend(q, k, v), dot_attend(q, k, v, scores_dtype=jnp.float32), "bf16 vs f32 scores")


def test_chunked_names_its_residuals_context():
  """A policy saving "context" keeps chunked's output and log-sum-exp, so the backward pass
  recomputes no attention forward; saving nothing keeps neither."""
  q, k, v, _ = qkv(GQA)

  def saved(policy):
    f = jax.checkpoint(lambda q, k, v: chunked_attend(q, k, v).astype(jnp.float32).sum(), policy=policy)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      jax.ad_checkpoint.print_saved_residuals(f, q, k, v)
    return out.getvalue()

  lse_shape = "f32[1,1,2,2,128]"  # [T/block, B, K, G, block]
  assert lse_shape in saved(jax.checkpoint_policies.save_only_these_names("context"))
  assert lse_shape not in saved(jax.checkpoint_policies.nothing_saveable)


# --- the registry and auto -------------------------------------------------------------------


def shapes(seq=4096, heads=16, kv_heads=8, head_dim=128, dtype="bfloat16", **kw):
  return AttentionShapes(
    batch=4, seq=seq, kv_seq=seq, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
    v_head_dim=kw.pop("v_head_dim", head_dim), dtype=dtype, **kw,
  )


def test_names():
  assert ATTENTION_NAMES == ("auto", "dot", "chunked", "splash", "cudnn", "triton")
  assert set(IMPLEMENTATIONS) == set(ATTENTION_NAMES) - {"auto"}


def test_each_entry_holds_its_platforms_kernel_flops_and_constraints():
  """One entry per implementation: the fused kernels (counted from their shapes, run under
  shard_map) carry their FLOPs accounting; the help and the errors list the registry's names."""
  import argparse

  from jaxmem.cli._common import add_workload

  fused = {n for n, impl in IMPLEMENTATIONS.items() if impl.fused}
  assert fused == {"splash", "cudnn", "triton"}
  for name, impl in IMPLEMENTATIONS.items():
    assert get_attention(name) is impl and set(impl.platforms) <= {"cpu", "gpu", "tpu"}
    assert (impl.kernel_flops is not None) == impl.fused, name
  help_text = attention_help()
  assert all(name in help_text for name in ATTENTION_NAMES) and "splash on TPU" in help_text
  parser = argparse.ArgumentParser()
  add_workload(parser)
  (action,) = [a for a in parser._actions if "--attention" in a.option_strings]
  assert action.help == help_text
  with pytest.raises(JaxmemError, match=f"valid: {', '.join(ATTENTION_NAMES)}$"):
    get_attention("flash")


@pytest.mark.parametrize("platform,kernel", [("tpu", "splash"), ("gpu", "cudnn"), ("cpu", "chunked")])
def test_auto_picks_the_platforms_kernel(platform, kernel):
  if kernel == "cudnn" and kernels.cudnn_version() is None:
    pytest.skip("cuDNN not installed (the cuda extra's nvidia-cudnn-cu12)")
  choice = choose_attention("auto", platform=platform, shapes=shapes())
  assert (choice.requested, choice.name) == ("auto", kernel)
  assert not any("auto" in n for n in choice.notes)


@pytest.mark.parametrize(
  "platform,bad,why",
  [
    ("tpu", shapes(seq=1000), "multiple of 128"),  # splash's blocks
    ("gpu", shapes(head_dim=256), "head size"),  # cuDNN without a Hopper GPU attached
    ("gpu", shapes(v_head_dim=64), "v head size"),  # MLA
    ("tpu", shapes(), "sequence"),  # with the mesh below: a sequence axis
  ],
)
def test_auto_falls_back_to_chunked_with_the_reason(platform, bad, why):
  axes = mesh_axes({"fsdp": 2, "sequence": 2}) if why == "sequence" else None
  choice = choose_attention("auto", platform=platform, shapes=bad, axes=axes)
  assert choice.name == "chunked"
  (note,) = [n for n in choice.notes if n.startswith("attention auto:")]
  assert why in note and "using chunked" in note


def test_a_model_with_sinks_gets_chunked_on_gpu_and_cudnn_is_refused_in_one_line():
  """GPT-OSS's sinks: cuDNN and Triton (jax's) take none, so auto on a GPU is chunked, which
  computes them, with a note naming them; asked for by name, cuDNN is refused in one line."""
  from jaxmem.models import from_config

  from tests.test_hf import DATA

  gpt_oss = AttentionShapes.of(from_config(DATA / "tiny-gpt-oss.json"), batch=2, seq=256)
  assert gpt_oss.sinks and not AttentionShapes.of(get_config("tiny"), batch=2, seq=256).sinks
  choice = choose_attention("auto", platform="gpu", shapes=gpt_oss)
  assert choice.name == "chunked"
  (note,) = [n for n in choice.notes if n.startswith("attention auto:")]
  assert note == "attention auto: jax's cuDNN fused attention takes no attention sinks; using chunked"
  no_window = dataclasses.replace(gpt_oss, window=None)  # Triton's reason before sinks is the window
  for name, kernel in (("cudnn", "cuDNN fused"), ("triton", "Pallas Triton")):
    with pytest.raises(JaxmemError) as err:
      choose_attention(name, platform="gpu", shapes=no_window)
    msg = str(err.value)
    assert "\n" not in msg and f"jax's {kernel} attention takes no attention sinks" in msg, msg
    assert "use one of auto, dot, chunked" in msg and name not in msg.split("use one of")[1]
  assert choose_attention("auto", platform="tpu", shapes=gpt_oss).name == "splash"  # splash computes them


@needs_gpu
def test_cudnn_on_a_model_with_sinks_is_one_line_exit_2(capsys):
  from jaxmem.cli import main

  from tests.test_hf import DATA

  argv = ["compare", "--model", str(DATA / "tiny-gpt-oss.json"), "--target", "gpu:h100", "--batch", "2", "--seq", "256"]
  assert main([*argv, "--attention", "cudnn"]) == 2
  err = capsys.readouterr().err
  assert "attention 'cudnn' cannot be used here: jax's cuDNN fused attention takes no attention sinks" in err
  assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_explicit_names_are_never_replaced():
  with pytest.raises(JaxmemError) as err:
    choose_attention("splash", platform="gpu", shapes=shapes())
  msg = str(err.value)
  assert "\n" not in msg and "splash" in msg and "GPU" in msg
  assert "auto" in msg and "dot" in msg and "chunked" in msg  # the alternatives
  with pytest.raises(JaxmemError, match="sequence"):
    choose_attention("splash", platform="tpu", shapes=shapes(), axes=mesh_axes({"data": 2, "sequence": 2}))
  with pytest.raises(JaxmemError, match="tensor=16"):
    choose_attention("triton", platform="gpu", shapes=shapes(), axes=mesh_axes({"tensor": 16}))
  with pytest.raises(JaxmemError, match="valid: auto, dot"):
    choose_attention("flash", platform="tpu", shapes=shapes())
  # What can run everywhere does.
  for name in ("dot", "chunked"):
    assert choose_attention(name, platform="tpu", shapes=shapes(seq=1000)).name == name


def test_cudnn_rows_say_the_workspace_is_missing_only_deviceless():
  if kernels.cudnn_version() is None:
    pytest.skip("cuDNN not installed (the cuda extra's nvidia-cudnn-cu12)")
  assert any("workspace" in n for n in choose_attention("cudnn", platform="gpu", shapes=shapes()).notes)
  assert not choose_attention("cudnn", platform="gpu", shapes=shapes(), deviceless=False).notes


def test_qk_dtype_reaches_dot():
  q, k, v, _ = qkv(GQA)
  for qk, want in ((None, dot_attend(q, k, v)), ("float32", dot_attend(q, k, v, scores_dtype=jnp.float32))):
    got = choose_attention("dot", platform="cpu", shapes=shapes(), qk_dtype=qk).attend(q, k, v)
    assert jnp.array_equal(got, want)


def test_shapes_of_a_model():
  cfg = get_config("llama3-8b")
  s = AttentionShapes.of(cfg, batch=8, seq=8192)
  assert (s.num_heads, s.num_kv_heads, s.head_dim, s.v_head_dim, s.seq, s.kv_seq) == (32, 8, 128, 128, 8192, 8192)


# --- through the model -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny32():
  cfg = get_config("tiny", dtype="float32")
  graphdef = nnx.graphdef(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
  # Initialised under jit: one compile instead of an eager dispatch per parameter op.
  params = jax.jit(lambda: nnx.state(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param))()
  toks = jax.random.randint(jax.random.key(1), (2, 33), 0, cfg.vocab_size)
  return cfg, graphdef, params, toks


def test_model_loss_and_grads_with_chunked_match_dot(tiny32):
  _, graphdef, params, toks = tiny32

  def loss(attend, vocab_tiles=1):
    return lambda p: nnx.merge(graphdef, p).loss(toks[:, :-1], toks[:, 1:], attend=attend, vocab_tiles=vocab_tiles)

  chunked = functools.partial(chunked_attend, block_q=8, block_kv=8)
  run = jax.jit(lambda p: [jax.value_and_grad(loss(a, n))(p) for a, n in ((None, 1), (chunked, 1), (None, 4))])
  (base, gbase), (lc, gc), (lt, gt) = run(params)
  assert jnp.allclose(lc, base, rtol=1e-5) and jnp.allclose(lt, base, rtol=1e-6)
  for a, b, c in zip(jax.tree.leaves(gc), jax.tree.leaves(gt), jax.tree.leaves(gbase), strict=True):
    assert jnp.allclose(a, c, rtol=1e-4, atol=1e-6)
    assert jnp.allclose(b, c, rtol=1e-5, atol=1e-7)


def test_vocab_tiles_one_is_todays_program(tiny32):
  import optax

  _, graphdef, params, toks = tiny32
  x, y = toks[:, :-1], toks[:, 1:]
  today = lambda p: optax.softmax_cross_entropy_with_integer_labels(nnx.merge(graphdef, p)(x), y).mean()  # noqa: E731
  tiled1 = lambda p: nnx.merge(graphdef, p).loss(x, y, vocab_tiles=1)  # noqa: E731
  text = lambda f: str(jax.make_jaxpr(jax.value_and_grad(f))(params))  # noqa: E731
  assert text(tiled1) == text(today)
  with pytest.raises(JaxmemError, match="divisor of the sequence length 32"):
    jax.eval_shape(lambda p: nnx.merge(graphdef, p).loss(x, y, vocab_tiles=5), params)


def test_vocab_tiling_lowers_temp_where_logits_dominate():
  # The model's head alone (what tiling changes): hidden states of 2 x 256 tokens, width 64,
  # a vocabulary of 8192: float32 logits of 16 MiB, and as much again for their gradient,
  # against a 2 MiB unembedding.
  b, t, d, vocab = 2, 256, 64, 8192
  x = jax.ShapeDtypeStruct((b, t, d), jnp.bfloat16)
  w = jax.ShapeDtypeStruct((d, vocab), jnp.float32)
  y = jax.ShapeDtypeStruct((b, t), jnp.int32)

  def temp(tiles):
    def loss(x_btd, w_dv, y_bt):
      head = lambda h: jnp.einsum("btd,dv->btv", h, w_dv.astype(h.dtype), preferred_element_type=jnp.float32)  # noqa: E731
      return cross_entropy(x_btd, y_bt, head, vocab_tiles=tiles)

    grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    return grads.lower(x, w, y).compile().memory_analysis().temp_size_in_bytes

  logits_bytes = b * t * vocab * 4
  untiled, tiled = temp(1), temp(8)
  assert untiled > logits_bytes, untiled  # the untiled logits do exist whole
  assert untiled - tiled > logits_bytes / 2, (untiled, tiled)


def test_prefill_through_attend_matches_the_cache_einsums(tiny32):
  cfg, graphdef, params, toks = tiny32
  m = nnx.merge(graphdef, params)
  cache = KVCache.zeros(cfg, batch=2, context=48)
  want, want_cache = m.cached(toks[:, :32], cache, pos=0, last_only=False)
  got, got_cache = m.cached(toks[:, :32], cache, pos=0, last_only=False, attend=chunked_attend)
  assert jnp.allclose(got, want, atol=1e-4)
  # The first layer's keys are the same computation; later layers' differ by float rounding.
  assert jnp.array_equal(got_cache.k_lbksh[0], want_cache.k_lbksh[0])
  assert jnp.allclose(got_cache.v_lbksh, want_cache.v_lbksh, atol=1e-5)
  with pytest.raises(JaxmemError, match="pos=0 only"):
    m.cached(toks[:, 32:33], got_cache, pos=32, attend=chunked_attend)


# --- memory through the real compilers, deviceless --------------------------------------------


def attention_temp(attend, target_mesh, shape, *, lowering=contextlib.nullcontext):
  """temp bytes of grad(attend(q, k, v).sum()) compiled for the mesh's devices; batch over
  the data axes, heads over tensor, as the train step shards them."""
  b, t, n, k, h = shape
  names = target_mesh.axis_names
  batch = tuple(a for a in ("data", "fsdp") if a in names) or None
  sh = NamedSharding(target_mesh, PartitionSpec(batch, None, "tensor" if "tensor" in names else None, None))
  q = jax.ShapeDtypeStruct((b, t, n, h), jnp.bfloat16, sharding=sh)
  kv = jax.ShapeDtypeStruct((b, t, k, h), jnp.bfloat16, sharding=sh)
  f = jax.jit(jax.grad(lambda q, k, v: attend(q, k, v, causal=True).astype(jnp.float32).sum(), argnums=(0, 1, 2)))
  with lowering():
    lowered = f.lower(q, kv, kv)
  return lowered.compile().memory_analysis().temp_size_in_bytes


# Moderate: (B, T, N, K, H) = (2, 4096, 4, 2, 128). Over fsdp=2, tensor=2 a device holds one
# sequence and two heads: dot's bf16 scores alone are 64 MiB there, each q-sized array a kernel
# keeps (and transposes) 2 MiB. Head size 128 fills the TPU's 128 lanes, so layout padding does
# not inflate the small arrays.
MODERATE = (2, 4096, 4, 2, 128)


def moderate_shapes():
  b, t, n, k, h = MODERATE
  return shapes(seq=t, heads=n, kv_heads=k, head_dim=h)


@needs_tpu
def test_splash_compiles_for_tpu_over_data_fsdp_tensor_far_below_dot():
  """Against the scores dot must hold (libtpu takes ~15 s to compile dot itself here; dot's
  compiled temp at this shape, 224 MiB on libtpu 0.0.42.1, is above them; benchmarks/attention.py
  compiles both)."""
  mesh = tg.get_target("tpu:v5p-8").make_mesh((("data", 1), ("fsdp", 2), ("tensor", 2)))
  splash = choose_attention("splash", platform="tpu", shapes=moderate_shapes(), mesh=mesh, axes=mesh_axes(mesh))
  b, t, n, _, _ = MODERATE
  dot_scores_per_device = (b // 2) * (n // 2) * t * t * 2
  assert attention_temp(splash.attend, mesh, MODERATE) < dot_scores_per_device / 4


@needs_gpu
def test_cudnn_and_triton_compile_for_h100_far_below_dot():
  if kernels.cudnn_version() is None:
    pytest.skip("cuDNN not installed (the cuda extra's nvidia-cudnn-cu12): it is needed to trace")
  devices = tg.get_target("gpu:h100").devices()
  mesh = Mesh(np.array(devices[:1]), ("data",))
  temps = {}
  for name in ("dot", "cudnn", "triton"):
    choice = choose_attention(name, platform="gpu", shapes=moderate_shapes(), mesh=mesh, axes=mesh_axes(mesh))
    temps[name] = attention_temp(choice.attend, mesh, MODERATE, lowering=choice.lowering)
  assert temps["cudnn"] < temps["dot"] / 8 and temps["triton"] < temps["dot"] / 8, temps


def test_kernels_refuse_a_sequence_sharded_mesh_themselves():
  mesh = Mesh(np.array(jax.devices("cpu")[:4]).reshape(2, 2), ("data", "sequence"))
  with pytest.raises(JaxmemError, match="chunked or dot"):
    kernels.make_splash_attend(mesh, mesh_axes(mesh))


@pytest.mark.parametrize("make", [kernels.make_splash_attend, kernels.make_cudnn_attend, kernels.make_triton_attend])
def test_kernels_given_a_mesh_need_its_axes(make):
  """No default axis names inside models/: a mesh without its MeshAxes, or with another mesh's,
  is refused when the kernel is built."""
  mesh = Mesh(np.array(jax.devices("cpu")[:4]).reshape(2, 2), ("data", "tensor"))
  with pytest.raises(TypeError, match="MeshAxes"):
    make(mesh)
  with pytest.raises(ValueError, match="built for the mesh"):
    make(mesh, mesh_axes({"data": 4}))
  with pytest.raises(TypeError, match="MeshAxes"):
    choose_attention("dot", platform="cpu", shapes=shapes(), mesh=mesh)


def test_over_mesh_splits_batch_and_heads():
  """The shard_map wrapper hands each device its own batch and head shard: on a CPU mesh the
  cuDNN wrapper (XLA path) under it gives the single-device answer."""
  mesh = Mesh(np.array(jax.devices("cpu")[:4]).reshape(2, 2), ("fsdp", "tensor"))
  q, k, v, _ = qkv((2, 128, 4, 2, 16), dtype=jnp.float32)
  sharded = kernels.make_cudnn_attend(mesh, mesh_axes(mesh), implementation="xla")
  alone = kernels.make_cudnn_attend(None, implementation="xla")
  assert jnp.allclose(jax.jit(sharded)(q, k, v), alone(q, k, v), atol=1e-5)
  assert math.isclose(float(jnp.abs(alone(q, k, v)).max()), float(jnp.abs(dot_attend(q, k, v, scores_dtype=jnp.float32)).max()), rel_tol=1e-5)
