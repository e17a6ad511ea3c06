"""Hub ids (a local Hub cache, offline), the 2025 architectures from their published config.json
(parameter counts against the published totals), and local attention's memory."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import jaxmem
from jaxmem.errors import JaxmemError
from jaxmem.models import Transformer, count_active_params, count_checkpoint_params, count_params, from_config, get_config

from tests.test_hf import DATA
import benchmark_module

# Published totals (model cards / reports), in parameters; the file in tests/data/hf; which count.
PUBLISHED = {
  "gemma-3-27b-it": 27.016e9,  # Gemma 3 report, table 1: 1,416M embedding + 25,600M non-embedding (text; +417M vision)
  "gemma-2-9b": 9.24e9,  # google/gemma-2-9b model card
  "gpt-oss-20b": 20.9e9,  # OpenAI gpt-oss model card: 20.9B total
  "deepseek-v2-lite": 15.7e9,  # DeepSeek-V2 README: 15.7B (16B) total
  "phi-4": 14.7e9,  # Phi-4 technical report: 14.7B
  "glm-4.5-air": 106e9,  # GLM-4.5 README: 106B total
  "olmo-2-1124-7b": 7.3e9,  # OLMo 2 model card: 7.3B
}
# The Hub ids and the cache built from tests/data/hf: benchmarks/hub_models.py's, which compiles
# the same eight at full size.
_hub = benchmark_module.load("hub_models")
HUB_IDS, REV, hub_cache = _hub.HUB_IDS, _hub.REV, _hub.hub_cache
TINY = ("tiny-gemma2", "tiny-gemma3", "tiny-gpt-oss", "tiny-llama4", "tiny-deepseek-v2", "tiny-phi3", "tiny-glm4-moe", "tiny-olmo2")


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
  cache = hub_cache(tmp_path / "hub")
  monkeypatch.setenv("HF_HUB_CACHE", str(cache))
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  return cache


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_the_published_totals(name):
  cfg = from_config(DATA / f"{name}.json")
  assert abs(count_params(cfg) / PUBLISHED[name] - 1) < 0.01, count_params(cfg)


def test_llama4_scout_counts():
  """Meta publishes 109B total / 17B active for Scout, the total with its vision encoder: the
  text model's active count is within 1.5% of "17B", the checkpoint's total (text + the vision
  tower and projector counted from vision_config) within 1% of 109B."""
  cfg = from_config(DATA / "llama-4-scout-17b-16e.json")
  assert abs(count_active_params(cfg) / 17e9 - 1) < 0.015  # "17B": two significant digits
  assert count_params(cfg) < 109e9 * 0.99  # the text model alone is short of the published total
  assert 0.5e9 < cfg.vision_params < 1.5e9 and any("vision tower" in n for n in cfg.notes)
  assert abs(count_checkpoint_params(cfg) / 109e9 - 1) < 0.01
  assert count_checkpoint_params(from_config(DATA / "gpt-oss-20b.json")) == count_params(from_config(DATA / "gpt-oss-20b.json"))


def test_moe_active_counts_are_below_totals_and_follow_the_layout():
  oss, glm = from_config(DATA / "gpt-oss-20b.json"), from_config(DATA / "glm-4.5-air.json")
  assert count_active_params(oss) < count_params(oss) and oss.num_moe_layers == oss.num_layers
  assert glm.num_moe_layers == glm.num_layers - 1 and glm.mtp_layers == 1
  scout = from_config(DATA / "tiny-llama4.json")  # interleave step 2: every other layer MoE
  assert [scout.layer_is_moe(i) for i in range(4)] == [False, True, False, True]
  assert [scout.layer_window(i) for i in range(4)] == [128, 128, 128, None] and scout.window_chunked


def test_gemma3_pattern_and_text_config():
  cfg = from_config(DATA / "gemma-3-27b-it.json")
  assert cfg.vocab_size == 262_208 and cfg.tie_embeddings and cfg.qk_norm and cfg.norm_layout == "sandwich"
  assert cfg.num_windowed_layers == 62 - 10 and cfg.layer_window(5) is None and cfg.layer_window(60) == 1024
  gemma2 = from_config(DATA / "gemma-2-9b.json")
  assert gemma2.attn_softcap == 50.0 and gemma2.final_softcap == 30.0 and gemma2.global_every == 2


@pytest.mark.parametrize("name", TINY)
def test_tiny_architectures_build_with_the_counted_parameters(name):
  cfg = from_config(DATA / f"{name}.json")
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  built = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  assert built == count_params(cfg)


# Each architecture's step compiles here for the cheapest; the others, each half a minute to four
# minutes on two loaded cores, run with the slow tests (benchmarks/slow_tests.sh).
FAST_COMPILES = ("tiny-phi3",)


@pytest.mark.parametrize("name", [n if n in FAST_COMPILES else pytest.param(n, marks=pytest.mark.slow) for n in TINY])
def test_tiny_architectures_train_step_compiles(name, compile_one):
  cfg = from_config(DATA / f"{name}.json")
  row = compile_one(model=cfg, target="cpu", batch=2, seq=256, attention="dot", remat="full")  # no baseline beside it
  assert row.error is None and row.temp_size_in_bytes > 0


def _dot_temp(cfg):
  (row,) = jaxmem.compare(model=cfg, target="cpu", batch=1, seq=1024, attention="dot", remat="none")
  return row.temp_size_in_bytes


def test_windowed_dot_attention_keeps_fewer_score_bytes():
  base = get_config("tiny", num_layers=1, vocab_size=256)
  windowed = dataclasses.replace(base, name="tiny-windowed", sliding_window=128)
  assert _dot_temp(windowed) < _dot_temp(base)


def test_hub_id_from_the_local_cache_offline(offline_cache):
  for repo, name in HUB_IDS.items():
    cfg = jaxmem.load_model(repo)
    assert cfg.name == repo and count_params(cfg) == count_params(from_config(DATA / f"{name}.json"))
  assert get_config(f"microsoft/phi-4@{REV}").name == "microsoft/phi-4"
  assert jaxmem.load_model("microsoft/phi-4", revision=REV).d_model == 5120


def test_hub_id_offline_without_cache_is_one_line(tmp_path, monkeypatch, capsys):
  from jaxmem.cli import main

  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  with pytest.raises(JaxmemError, match="--model path/to/config.json") as e:
    jaxmem.load_model("google/gemma-3-27b-it")
  assert "\n" not in str(e.value) and "HF_HUB_OFFLINE" in str(e.value)
  assert main(["compare", "--model", "google/gemma-3-27b-it", "--target", "cpu"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "config.json" in err[0] and "Traceback" not in err[0]


def test_windowed_decode_matches_the_training_logits(decode_matches_forward):
  """A windowed model's ring cache (prefill, then decode past the window) gives the logits of
  the training forward pass: Gemma 3's pattern (6 local layers and the remainder) and window 8."""
  cfg = dataclasses.replace(
    from_config(DATA / "tiny-gemma3.json"), sliding_window=8, num_layers=7, param_dtype="float32", dtype="float32"
  )
  cache = decode_matches_forward(cfg, upto=20)
  assert cache.k_local.shape[3] == 8 and cache.k_lbksh.shape[3] == 32 and cache.k_local.shape[0] == 6


def test_infer_kv_cache_of_windowed_layers_is_the_window():
  """The compiled decode step's arguments hold the local layers' cache at the window's length:
  argument bytes less the weights are the closed form's cache, and the same model unwindowed
  holds more by the closed form's difference."""
  cfg = from_config(DATA / "tiny-gemma3.json")
  unwindowed = dataclasses.replace(cfg, name="unwindowed", sliding_window=None, global_every=0)
  rows = {}
  for c in (cfg, unwindowed):
    (rows[c.name],) = jaxmem.infer(model=c, target="cpu", phase="decode", context=2048, batch=2, weights="bf16")
  local, full = rows[cfg.name], rows["unwindowed"]
  assert local.kv_cache_bytes == jaxmem.models.cache_bytes(cfg, batch=2, context=2048) < full.kv_cache_bytes
  compiled_cache = local.argument_size_in_bytes - local.weight_bytes
  assert abs(compiled_cache / local.kv_cache_bytes - 1) < 0.02
  grown = full.argument_size_in_bytes - local.argument_size_in_bytes
  assert abs(grown / (full.kv_cache_bytes - local.kv_cache_bytes) - 1) < 0.02


@pytest.mark.parametrize("kernel", ["splash", "chunked"])
def test_kernels_compute_the_sinks_dot_computes_and_their_gradient(kernel):
  """GPT-OSS's sinks (one logit per query head in every softmax denominator) through splash's own
  ``sinks`` (interpreted) and chunked's online softmax (blocks that do not divide the sequence),
  with a window as GPT-OSS's local layers have: the output and the gradients, the sinks'
  included, are dot's."""
  import functools

  from jaxmem.models import attention_kernels as kernels
  from jaxmem.models.attention_ops import Local, chunked_attend, dot_attend

  keys = jax.random.split(jax.random.PRNGKey(1), 4)
  q = jax.random.normal(keys[0], (1, 256, 4, 16), jnp.float32)
  k, v = (jax.random.normal(x, (1, 256, 2, 16), jnp.float32) for x in keys[1:3])
  sinks = 2.0 * jax.random.normal(keys[3], (4,), jnp.float32)
  if kernel == "splash":
    attend = kernels.make_splash_attend(interpret=True)
  else:
    attend = functools.partial(chunked_attend, block_q=96, block_kv=80)

  def loss(attend, q, k, v, s, **kw):
    return jnp.sum(attend(q, k, v, causal=True, local=Local(128), sinks=s, **kw) ** 2)

  got = jax.grad(lambda *a: loss(attend, *a), argnums=(0, 1, 2, 3))(q, k, v, sinks)
  want = jax.grad(lambda *a: loss(dot_attend, *a, scores_dtype="float32"), argnums=(0, 1, 2, 3))(q, k, v, sinks)
  for g, w in zip(got, want):
    assert jnp.allclose(g, w, atol=2e-3, rtol=2e-3)
  out = attend(q, k, v, causal=True, local=Local(128), sinks=sinks)
  assert jnp.allclose(out, dot_attend(q, k, v, scores_dtype="float32", local=Local(128), sinks=sinks), atol=2e-3)
  assert not jnp.allclose(out, attend(q, k, v, causal=True, local=Local(128)), atol=2e-3)
  if kernel == "chunked":  # pure JAX: XLA partitions it, no shard_map of its own
    return
  # Over a mesh that splits the heads, each shard gets its own heads' sinks.
  import numpy as np
  from jax.sharding import Mesh
  from jaxmem.program.sharding import mesh_axes

  mesh = Mesh(np.array(jax.devices("cpu")[:4]).reshape(2, 2), ("fsdp", "tensor"))
  q2, k2, v2 = (jnp.concatenate([x, x[..., ::-1]]) for x in (q, k, v))  # a batch of 2 for the fsdp axis
  sharded = kernels.make_splash_attend(mesh, mesh_axes(mesh), interpret=True)
  want = dot_attend(q2, k2, v2, scores_dtype="float32", local=Local(128), sinks=sinks)
  assert jnp.allclose(sharded(q2, k2, v2, causal=True, local=Local(128), sinks=sinks), want, atol=2e-3)


@pytest.mark.parametrize("kernel", ["splash", "cudnn"])
def test_fused_kernels_take_the_window(kernel):
  """Splash's LocalMask (interpreted) and cuDNN's local_window_size (through XLA's reference
  path) compute the sliding window dot attention computes."""
  from jaxmem.models import attention_kernels as kernels
  from jaxmem.models.attention_ops import Local, dot_attend

  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  q = jax.random.normal(keys[0], (1, 256, 4, 16), jnp.float32)
  k, v = (jax.random.normal(x, (1, 256, 2, 16), jnp.float32) for x in keys[1:])
  if kernel == "splash":
    attend = kernels.make_splash_attend(interpret=True)
  else:
    attend = kernels.make_cudnn_attend(implementation="xla")
  got = attend(q, k, v, causal=True, local=Local(128))
  want = dot_attend(q, k, v, scores_dtype="float32", local=Local(128))
  assert jnp.allclose(got, want, atol=2e-3)
  assert not jnp.allclose(got, dot_attend(q, k, v, scores_dtype="float32"), atol=2e-3)
