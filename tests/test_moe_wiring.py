"""Mixture of experts end to end: the expert mesh axis, the MoE sweep (--moe-impl,
--capacity-factor), dropless experts per device under shard_map, ragged-all-to-all in the comm
figures, estimate's MoE closed forms, infer's latent (MLA) KV cache, quantized MoE/MLA weights,
residuals and remat presets over the MoE names, and `jaxmem models`."""

from __future__ import annotations

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh

from jaxmem.cli import main
from jaxmem.axes import configured
from jaxmem.errors import JaxmemError
from jaxmem.buffers.residuals import saved_residuals_by_policy
from jaxmem.hlo.comms import collectives_from_hlo
from jaxmem.planning import estimate as est
from jaxmem.inference import infer, quant
from jaxmem.models import Transformer, count_active_params, count_params, get_config, sharded_dropless
from jaxmem.models import moe_parallel
from jaxmem.models.layers import DEFAULT_INIT, no_constraint
from jaxmem.models.moe import MoE
from jaxmem.resolve import plan
from jaxmem.planning.sweep import compare
from jaxmem.program import sharding as shd
from jaxmem.program.remat import REMAT_POLICIES
from jaxmem.program.train import abstract_model, moe_choice
from jaxmem.render import tables
from jaxmem.workload import Workload

MOE = dict(model="tiny-moe", remat="none", batch=8, seq=16)
IMPLS = ("dropless", "capacity")


def normal(shape, seed: int) -> jax.Array:
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def random_params(abstract, seed: int = 0):
  """Values from numpy (initialising through the model would compile its RNG program)."""
  rng = np.random.default_rng(seed)

  def one(path, a):
    near_one = "norm" in jax.tree_util.keystr(path) or "scale" in jax.tree_util.keystr(path)
    z = rng.standard_normal(a.shape)
    return jnp.asarray(1 + 0.1 * z if near_one else 0.05 * z, a.dtype)

  return jax.tree_util.tree_map_with_path(one, abstract)


# --- the sweep's inputs ----------------------------------------------------------------------


def test_moe_fields_are_sweep_axes_and_tasks_carry_one_variant_each():
  w = Workload(**MOE, target="cpu", moe_impl="dropless, capacity", capacity_factor="1,2.5")
  assert w.moe_impl == ("dropless", "capacity") and w.capacity_factor == (1.0, 2.5)
  p = plan(w)
  variants = [(t.workload.moe_impl, t.workload.capacity_factor) for t in p.tasks()]
  assert variants == [(("dropless",), ()), (("capacity",), (1.0,)), (("capacity",), (2.5,))]
  assert len({t.cache_key() for t in p.tasks()}) == 3
  # Capacity factors alone imply capacity; each task's own plan resolves its variant.
  one = plan(plan(Workload(**MOE, target="cpu", capacity_factor=3)).tasks()[0].workload)
  _, choices = one.built()
  assert (choices.moe_impl, choices.capacity_factor) == ("capacity", 3.0)
  assert plan(Workload(**MOE, target="cpu")).built()[1].moe_impl == "dropless"


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(model="tiny", moe_impl="capacity"), "no experts"),
        (dict(model="tiny-moe", moe_impl="sparse"), "unknown `moe_impl`"),
        (dict(model="tiny-moe", moe_impl="dropless", capacity_factor="2"), "applies to `moe_impl` capacity"),
        (dict(model="tiny-moe", capacity_factor="0"), "must be > 0"),
        (dict(model="tiny-moe", capacity_factor="x"), "numbers"),
    ],
)
def test_bad_moe_choices_are_one_line_errors(fields, match):
  with pytest.raises(JaxmemError, match=match) as err:
    plan(Workload(**{**MOE, **fields}, target="cpu"))
  assert "\n" not in str(err.value)


def test_gpu_default_is_capacity_with_the_reason_and_dropless_is_noted():
  def choice(**fields):
    p = plan(Workload(**MOE, **fields))
    return moe_choice(*configured(p.cfg, p.choices, p.options()), p.target.platform, p.options())

  choices, notes = choice(target="gpu:h100")
  assert choices.moe_impl == "capacity" and any("ragged_dot" in n and "dense matmul" in n for n in notes)
  choices, notes = choice(target="gpu:h100", moe_impl="dropless")
  assert choices.moe_impl == "dropless" and any("ragged_dot" in n for n in notes)
  assert choice(target="tpu:v5e-1")[1] == ()


def test_expert_count_the_axis_does_not_divide_is_one_line_through_the_cli(capsys):
  argv = ["compare", "--model", "tiny-moe", "--target", "cpu:3", "--mesh", "expert=3", "--batch", "6", "--seq", "16"]
  assert main(argv) == 2
  err = capsys.readouterr().err
  assert "expert=3" in err and "8 experts" in err and len(err.strip().splitlines()) == 1
  assert main(["compare", "--model", "tiny", "--target", "cpu", "--moe-impl", "capacity"]) == 2
  assert "no experts" in capsys.readouterr().err


# --- sharding ----------------------------------------------------------------------------------


def test_expert_axis_rules_split_experts_weights_only_and_keep_the_router_whole():
  cfg = get_config("tiny-mla")
  _, params, logical = abstract_model(cfg)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("expert", "fsdp"))
  shardings = shd.param_shardings(params, logical, mesh)
  specs = {jax.tree_util.keystr(p): s.spec for p, s in jax.tree_util.tree_leaves_with_path(shardings)}
  gate = next(s for k, s in specs.items() if "w_gate_edf" in k)
  router = next(s for k, s in specs.items() if "w_router_de" in k)
  bias = next(s for k, s in specs.items() if "b_select_e" in k)
  assert gate[1] == "expert" and gate[2] == "fsdp"
  assert "expert" not in tuple(router) and "expert" not in tuple(bias)
  assert shd.data_parallel_size((("expert", 4), ("fsdp", 2))) == 8  # the batch is split over both


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(model="tiny", mesh="fsdp=8"), "tiny has no experts"),
        (dict(model="tiny-moe", mesh="data=8"), "applies to meshes with an fsdp axis"),
        (dict(model="tiny-moe", mesh="fsdp=3", target="cpu:3", batch=6), "over fsdp=3 .* do not divide them"),
        (dict(model="tiny-moe", mesh="fsdp=8", fsdp_shard_on_exp="maybe"), "takes on or off"),
    ],
)
def test_bad_experts_on_fsdp_is_one_line_before_compiling(fields, match):
  with pytest.raises(JaxmemError, match=match) as err:
    plan(Workload(**{**MOE, "target": "cpu:8", "fsdp_shard_on_exp": "on", **fields}))
  assert "\n" not in str(err.value)


def test_experts_on_fsdp_rules_split_the_expert_dimension_and_leave_d_model_whole():
  cfg = get_config("tiny-mla")
  _, params, logical = abstract_model(cfg)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("expert", "fsdp"))
  default = shd.param_shardings(params, logical, mesh)
  on_fsdp = shd.param_shardings(params, logical, mesh, shd.param_rules(experts_on_fsdp=True))

  def spec(shardings, name):
    return next(s.spec for p, s in jax.tree_util.tree_leaves_with_path(shardings) if name in jax.tree_util.keystr(p))

  # [layers, E, D, F] and [layers, E, F, D], the layers stacked first.
  assert tuple(spec(default, "w_gate_edf"))[1:3] == ("expert", "fsdp")
  assert tuple(spec(on_fsdp, "w_gate_edf"))[1:3] == (("expert", "fsdp"), None)
  down = tuple(spec(on_fsdp, "w_down_efd")) + (None,) * 4
  assert down[1] == ("expert", "fsdp") and down[3] is None
  assert spec(on_fsdp, "w_router_de") == spec(default, "w_router_de")  # only the experts' weights move


# --- compiled: cpu:8, TPU, GPU ------------------------------------------------------------------


@pytest.fixture(scope="module")
def cpu8_rows():
  """tiny-moe on 8 simulated CPU devices, dropless under expert parallelism and under data
  parallelism to set it against (data parallel exchanges no tokens, with either
  implementation): two compiles shared by the tests below."""
  rows = compare(**MOE, target="cpu:8", mesh="expert=8", moe_impl="dropless")
  rows += compare(**MOE, target="cpu:8", mesh="data=8", moe_impl="dropless")
  return {(r.mesh, r.moe_impl): r for r in rows}


def _exchanges_tokens(expert, data, impl):
  assert data.error is None and expert.error is None
  assert expert.comm_all_to_all_bytes > 0
  assert expert.comm_all_to_all_bytes > data.comm_all_to_all_bytes, impl
  assert (expert.moe_impl, expert.capacity_factor) == (impl, 1.25 if impl == "capacity" else None)


def test_expert_mesh_exchanges_tokens_with_all_to_all_on_cpu8(cpu8_rows):
  _exchanges_tokens(cpu8_rows["expert=8", "dropless"], cpu8_rows["data=8", "dropless"], "dropless")


@pytest.mark.slow  # a third cpu:8 compile; the dropless case above holds the expert mesh's wiring
def test_capacity_routing_over_an_expert_mesh_exchanges_tokens_and_shows_its_factor(cpu8_rows):
  (capacity,) = compare(**MOE, target="cpu:8", mesh="expert=8", moe_impl="capacity")
  _exchanges_tokens(capacity, cpu8_rows["data=8", "dropless"], "capacity")
  text = tables.render_compare([*cpu8_rows.values(), capacity], "table")
  assert "capacity factor" in text.splitlines()[2] and "1.25" in text


def test_expert_mesh_holds_one_eighth_of_the_experts_weights_and_state(cpu8_rows):
  cfg = get_config("tiny-moe")
  expert_bytes = 4 * est.expert_params(cfg)  # float32 parameters
  data, expert = cpu8_rows["data=8", "dropless"], cpu8_rows["expert=8", "dropless"]
  assert data.param_bytes == data.param_bytes_global == 4 * count_params(cfg)
  assert data.param_bytes - expert.param_bytes == expert_bytes - expert_bytes // 8
  # AdamW: two moments shaped like the parameters, so twice the saving.
  assert data.optimizer_state_bytes - expert.optimizer_state_bytes == 2 * (expert_bytes - expert_bytes // 8)


def test_compare_table_shows_the_moe_columns(cpu8_rows):
  text = tables.render_compare(list(cpu8_rows.values()), "table")
  head = text.splitlines()[2]
  assert "moe" in head and "dropless" in text


@pytest.mark.slow  # a TPU compile of an expert mesh; the CPU expert mesh above counts its all-to-alls
@pytest.mark.needs_tpu_compiler
def test_tpu_expert_mesh_counts_ragged_all_to_all():
  rows = compare(**MOE, target="tpu:v5p-8", mesh="expert=4", moe_impl=",".join(IMPLS))
  for r in rows:
    assert r.error is None and r.comm_all_to_all_bytes > 0, (r.moe_impl, r.notes)
    assert not any("not counted" in n for n in r.notes)


@pytest.mark.slow  # a deviceless GPU compile of both MoE paths; the CPU and TPU cases above cover the wiring
@pytest.mark.needs_gpu_compiler
def test_gpu_compiles_both_implementations_and_notes_dropless():
  rows = {r.moe_impl: r for r in compare(**MOE, target="gpu:h100", moe_impl=",".join(IMPLS))}
  assert all(r.error is None and r.temp_size_in_bytes > 0 for r in rows.values())
  assert any("ragged_dot" in n for n in rows["dropless"].notes)
  assert not any("ragged_dot" in n for n in rows["capacity"].notes)


@pytest.mark.slow  # three compiles of the capacity path
def test_capacity_temp_grows_with_the_capacity_factor():
  rows = compare(model="tiny-moe", remat="none", batch=2, seq=64, target="cpu", capacity_factor="1,4")
  assert [(r.moe_impl, r.capacity_factor) for r in rows] == [("capacity", 1.0), ("capacity", 4.0)]
  assert rows[0].temp_size_in_bytes < rows[1].temp_size_in_bytes


# --- dropless per device: the shard_map against the plain experts --------------------------------


def emulated_ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *, axis_name):
  """jax.lax.ragged_all_to_all's documented semantics from all_gathers (XLA:CPU cannot compile
  the real one): each source's rows [input_offsets, +send_sizes) for this device are written
  at the source's output_offsets for it."""
  del recv_sizes
  rows_p = jax.lax.all_gather(operand, axis_name)
  starts, sizes, froms = (jax.lax.all_gather(a, axis_name) for a in (output_offsets, send_sizes, input_offsets))
  me = jax.lax.axis_index(axis_name)
  start, size, src = starts[:, me], sizes[:, me], froms[:, me]
  r = jnp.arange(output.shape[0])
  hit = (r[None] >= start[:, None]) & (r[None] < (start + size)[:, None])
  s = jnp.argmax(hit, axis=0)
  got = rows_p[s, jnp.clip(src[s] + r - start[s], 0, operand.shape[0] - 1)]
  return jnp.where(hit.any(0)[:, None], got, output)


# Gemma 4's MoE block (ModelConfig.moe_beside_dense): GeGLU experts, its router's scales.
_GEMMA4_MOE = {"norm_layout": "sandwich", "moe_beside_dense": True, "expert_act": "gelu_tanh"}


@pytest.mark.parametrize(
    "name, axes, exchange, fields",
    [
      ("tiny-moe", (("data", 2), ("expert", 4)), "ragged", {}),
      ("tiny-mla", (("expert", 2), ("tensor", 2), ("fsdp", 2)), "padded", {}),
      ("tiny-moe", (("expert", 2), ("tensor", 2), ("data", 2)), "padded", _GEMMA4_MOE),
    ],
)
def test_sharded_dropless_matches_the_plain_experts_forward_and_gradients(name, axes, exchange, fields, monkeypatch):
  monkeypatch.setattr(moe_parallel, "_ragged_all_to_all", emulated_ragged_all_to_all)
  cfg = dataclasses.replace(get_config(name, dtype="float32"), **fields)
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: MoE(cfg, out_init=DEFAULT_INIT, rngs=nnx.Rngs(0))), nnx.Param)
  params = random_params(abstract)
  mesh = Mesh(np.array(jax.devices()[:8]).reshape([n for _, n in axes]), tuple(a for a, _ in axes))
  hook = sharded_dropless(mesh, shd.mesh_axes(mesh), exchange=exchange)
  x = normal((8, 16, cfg.d_model), 3)

  def loss(p, x_btd, experts):
    return jnp.sum(nnx.merge(graphdef, p)(x_btd, constrain=no_constraint, experts=experts) ** 2)

  run = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), static_argnums=2)
  (want, want_g), (got, got_g) = run(params, x, None), run(params, x, hook)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(got_g), jax.tree.leaves(want_g), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)


# --- the comm figures of ragged-all-to-all, and XLA:CPU's shared channel ids ----------------------

_RAGGED = """HloModule m, num_partitions=4

ENTRY %main (x: bf16[8,128], buf: bf16[32,128], o: s32[4], s: s32[4]) -> (bf16[32,128], bf16[8,128]) {
  %x = bf16[8,128]{1,0} parameter(0)
  %buf = bf16[32,128]{1,0} parameter(1)
  %o = s32[4]{0} parameter(2)
  %s = s32[4]{0} parameter(3)
  %there = bf16[32,128]{1,0} ragged-all-to-all(%x, %buf, %o, %s, %o, /*index=5*/%s), channel_id=1, replica_groups={{0,1,2,3}}
  %start = ((bf16[32,128]{1,0}, bf16[8,128]{1,0}, s32[4]{0}, s32[4]{0}, s32[4]{0}, /*index=5*/s32[4]{0}), bf16[8,128]{1,0}) ragged-all-to-all-start(%there, %x, %o, %s, %o, /*index=5*/%s), channel_id=1, replica_groups={{0,1,2,3}}
  %back = bf16[8,128]{1,0} ragged-all-to-all-done(%start)
  ROOT %t = (bf16[32,128]{1,0}, bf16[8,128]{1,0}) tuple(%there, %back)
}
"""


def test_ragged_all_to_all_counts_as_all_to_all_of_the_smaller_buffer():
  c = collectives_from_hlo(_RAGGED)
  # Both trips move the 8 real rows (8 x 128 bf16 = 2048 bytes), 3/4 of them to other devices,
  # though the dispatch's receive buffer (and so the return's send buffer) holds 32.
  assert c.count_by_kind["all_to_all"] == 2
  assert c.bytes_by_kind["all_to_all"] == 2 * 3 * 2048 // 4
  assert not any("not counted" in n for n in c.notes)


# --- estimate ----------------------------------------------------------------------------------


def test_estimate_moe_closed_forms_from_shapes():
  cfg = get_config("qwen3-30b-a3b")
  e = est.estimate(model=cfg, batch=2, seq=2048)
  assert e.active_params == count_active_params(cfg) < e.params
  assert e.expert_params == cfg.num_moe_layers * cfg.num_experts * 3 * cfg.d_model * cfg.expert_d_ff
  assert e.expert_state_bytes + e.non_expert_state_bytes == e.model_state_bytes
  assert e.expert_state_bytes > 10 * e.non_expert_state_bytes  # experts are most of the state
  n, k, d, f = 2 * 2048, 8, 2048, 768
  assert e.dispatch_bytes_dropless_per_layer == 2 * (2 * n * k * d + 3 * n * k * f)
  c = math.ceil(1.25 * 2048 * k / 128)
  assert e.dispatch_bytes_capacity_per_layer == 2 * (2 * 2 * 2048 * 128 * c + 128 * 2 * c * (2 * d + 3 * f))
  assert e.dispatch_bytes_capacity == 48 * e.dispatch_bytes_capacity_per_layer
  bigger = est.estimate(model=cfg, batch=2, seq=2048, capacity_factor=2.0)
  assert bigger.dispatch_bytes_capacity > e.dispatch_bytes_capacity
  dense = est.estimate(model="llama3-8b")
  assert dense.expert_params == 0 and dense.dispatch_bytes_dropless is None and dense.active_params == dense.params


def test_mla_kv_cache_per_token_is_the_latent_and_far_below_gqa():
  ds, llama = get_config("deepseek-v3"), get_config("llama3-70b")
  e_ds, e_llama = est.estimate(model=ds), est.estimate(model=llama)
  assert e_ds.kv_cache_bytes_per_token == ds.num_layers * (512 + 64) * 2 == 70_272
  assert e_llama.kv_cache_bytes_per_token == 2 * 80 * 8 * 128 * 2
  assert e_ds.kv_cache_bytes_per_token < e_llama.kv_cache_bytes_per_token / 4
  # Multi-head attention with DeepSeek-V3's heads would cache 128 x (192 + 128) per layer and token.
  assert e_ds.kv_cache_bytes_per_token * 70 < ds.num_layers * 128 * (192 + 128) * 2


def test_estimate_cli_shows_moe_and_kv_per_token(capsys):
  assert main(["estimate", "--model", "deepseek-v3,llama3-70b", "--seq", "2048", "--batch", "1"]) == 0
  out = capsys.readouterr().out
  assert "kv per token KB" in out and "70.3" in out and "327.7" in out
  assert "mixture of experts" in out and "GShard" in out and "megablox" in out


# --- infer with the latent cache ----------------------------------------------------------------


def test_infer_mla_row_reports_the_latent_cache_per_token():
  (row,) = infer.infer(model="tiny-mla", target="cpu", phase="decode", context=64, batch=2)
  cfg = get_config("tiny-mla")
  assert row.error is None and row.attention_kind == "MLA"
  assert row.kv_cache_bytes_per_token == cfg.num_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 2
  assert row.kv_cache_bytes == row.kv_cache_bytes_per_token * 64 * 2 == row.kv_cache_bytes_per_device
  # The compiled step's arguments hold the stored weights and that cache.
  assert row.argument_size_in_bytes >= row.weight_bytes_per_device + row.kv_cache_bytes_per_device
  gqa = get_config("tiny")
  assert row.kv_cache_bytes_per_token < 2 * gqa.num_layers * gqa.num_kv_heads * gqa.head_dim * 2


def test_infer_deepseek_v3_kv_cache_per_token_cli(capsys):
  # 671B parameters, compiled for one CPU device from shapes alone: about 15 s.
  argv = ["infer", "--model", "deepseek-v3", "--target", "cpu", "--phase", "decode", "--context", "256", "--format", "json"]
  assert main(argv) == 0
  (row,) = json.loads(capsys.readouterr().out)["rows"]
  assert row["kv_cache_bytes_per_token"] == 61 * (512 + 64) * 2
  assert row["kv_cache_bytes"] == row["kv_cache_bytes_per_token"] * 256


def test_quantized_moe_and_mla_weights_keep_per_channel_scales_and_decode_close():
  cfg = get_config("tiny-mla", dtype="float32")
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))), nnx.Param)
  params = random_params(abstract)
  stored = quant.quantize_params(params, quant.WEIGHT_FORMATS["int8"])
  flat = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(stored, is_leaf=quant.is_qtensor)}
  pick = lambda name: next(v for k, v in flat.items() if name in k and "moe_blocks" in k)  # noqa: E731
  layers, e, f = cfg.num_moe_layers, cfg.num_experts, cfg.expert_d_ff
  assert pick("w_gate_edf").scale.shape == (layers, e, 1, f)
  assert pick("w_k_b_cnh").scale.shape == (layers, 1, cfg.num_heads, 1)  # one per head, for both forms
  assert not isinstance(pick("w_router_de"), quant.QTensor)  # routers stay bfloat16
  # An attention weight of the MoE stack is stacked too: its scale has the layers axis.
  assert pick("w_o_nvd").scale.shape == (layers, 1, 1, cfg.d_model)
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 6)), jnp.int32)
  cache = type(infer.abstract_cache(cfg, batch=2, context=8, jmesh=Mesh(np.array(jax.devices()[:1]), ("data",)))[0])
  empty = cache.zeros(cfg, batch=2, context=8)

  @jax.jit  # one compile for both prefills
  def prefills(params, stored):
    want, _ = nnx.merge(graphdef, params).cached(tokens, empty, pos=0)
    got, _ = nnx.merge(graphdef, stored).cached(tokens, empty, pos=0, weights=quant.weight_hook(jnp.float32))
    return want, got

  want, got = prefills(params, stored)
  assert jnp.abs(got - want).max() < 0.05 * jnp.abs(want).max() + 1e-3


# --- residuals, remat presets, models ----------------------------------------------------------


def test_residuals_list_an_moe_layer_and_the_presets_save_its_names():
  by = {r.remat: r for r in saved_residuals_by_policy(model="tiny-mla", remat="full,minimal", batch=2, seq=16)}
  names = {x.name for x in by["minimal"].residuals}
  assert {"moe_mlpwi_0", "moe_mlpwi_1"} <= names and "router_logits" not in names
  assert by["none"].per_layer_bytes > by["minimal"].per_layer_bytes > by["full"].per_layer_bytes
  cfg = get_config("tiny-mla")
  # Totals: the MoE layers at the listed size, the dense prefix at its own (smaller: no router).
  assert by["none"].total_bytes < by["none"].per_layer_bytes * cfg.num_layers
  assert by["full"].total_bytes == by["full"].per_layer_bytes * cfg.num_layers  # only each layer's input
  assert "moe_mlpwo" in REMAT_POLICIES["save_dot_except_mlpwi"].saves
  assert {"moe_mlpwi_0", "moe_mlpwi_1", "moe_mlpwo", "mlpwi_0"} <= set(REMAT_POLICIES["minimal_with_context"].saves)


def test_models_lists_active_parameters_experts_and_attention(capsys):
  assert main(["models", "--format", "json"]) == 0
  by = {r["model"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
  published = {"mixtral-8x7b": (46.7e9, 12.9e9), "qwen3-30b-a3b": (30.5e9, 3.3e9), "deepseek-v3": (671e9, 37e9)}
  for name, (total, active) in published.items():
    assert abs(by[name]["params"] / total - 1) < 0.01 and abs(by[name]["active_params"] / active - 1) < 0.02
  assert (by["deepseek-v3"]["experts"], by["deepseek-v3"]["top_k"], by["deepseek-v3"]["shared_experts"]) == (256, 8, 1)
  assert [by[m]["attention"] for m in ("deepseek-v3", "mixtral-8x7b", "gpt2-small")] == ["MLA", "GQA", "MHA"]
  assert by["llama3-8b"]["active_params"] == by["llama3-8b"]["params"] and by["llama3-8b"]["experts"] is None
