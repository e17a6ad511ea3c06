"""The named registries (remat policies, optimizers, weight formats, presets): names, errors,
what `all` means, and remat policies checked against jax's own (mesh strings: test_sharding.py)."""

import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from jaxmem.errors import JaxmemError
from jaxmem.inference.quant import WEIGHT_FORMATS
from jaxmem.models import CHECKPOINT_NAMES, PRESETS, get_config
from jaxmem.program import optimizers, remat
from jaxmem.program.train import abstract_model
from jaxmem.registry import Registry

COLORS = Registry("color", {"red": 1, "green": 2, "blue": 3}, flag="colors", in_all=lambda v: v != 3)


def test_registry_is_a_read_only_mapping():
  assert list(COLORS) == ["red", "green", "blue"] and len(COLORS) == 3 and "red" in COLORS
  assert COLORS["green"] == 2 and dict(COLORS.items())["blue"] == 3
  assert COLORS.get("pink", None) is None  # Mapping.get with a default still works
  with pytest.raises(TypeError):
    COLORS["pink"] = 4  # type: ignore[index]


def test_registry_get_lists_the_valid_names():
  with pytest.raises(JaxmemError, match=r"^unknown color 'pink'; valid: red, green, blue, all$"):
    COLORS.get("pink")


def test_registry_parse_keeps_order_once_each():
  assert COLORS.parse("blue, red,blue") == (3, 1)
  assert COLORS.parse(["green", "red,blue"]) == (2, 1, 3)
  assert COLORS.parse("all") == (1, 2)  # in_all leaves blue out
  assert COLORS.parse("all", all_filter=lambda v: v > 1) == (2,)
  with pytest.raises(JaxmemError, match="`colors` is empty"):
    COLORS.parse(" , ")


@pytest.mark.parametrize("registry,kind", [(remat.REMAT_POLICIES, "remat policy"), (optimizers.OPTIMIZERS, "optimizer"),
                                           (WEIGHT_FORMATS, "weight format"), (PRESETS, "model")])
def test_every_registry_answers_alike(registry, kind):
  first = next(iter(registry))
  assert registry.get(first) is registry[first]
  with pytest.raises(JaxmemError, match=f"unknown {kind} 'nope'; valid: {first}"):
    registry.parse(f"{first},nope")


# jax's checkpoint policies and policy factories, written out by hand (jax 0.10.2 and 0.12.0.1
# have the same twelve): the registry is checked against this list and against behaviour, not
# against a copy of remat._is_policy's signature test.
JAX_POLICIES = ("everything_saveable", "nothing_saveable", "dots_saveable", "checkpoint_dots",
                "dots_with_no_batch_dims_saveable", "checkpoint_dots_with_no_batch_dims")
JAX_FACTORIES = ("save_only_these_names", "save_any_names_but_these", "save_anything_except_these_names",
                 "save_and_offload_only_these_names", "save_from_both_policies", "offload_dot_with_no_batch_dims")
_A, _B = jax.ShapeDtypeStruct((4, 8), jnp.float32), jax.ShapeDtypeStruct((8, 2), jnp.float32)
_MATMUL = dict(dimension_numbers=(((1,), (0,)), ((), ())), precision=None, preferred_element_type=None)
_BATCHED = dict(dimension_numbers=(((2,), (1,)), ((0,), (0,))), precision=None, preferred_element_type=None)


def _decides(fn) -> bool:
  """Behaves as a policy: called as jax calls one, ``policy(prim, *avals, **params)``, it answers
  with a decision (a bool) for a matmul, rather than refusing the call or returning a policy."""
  try:
    return isinstance(fn(jax.lax.dot_general_p, _A, _B, **_MATMUL), bool)
  except TypeError:
    return False


_ALIASES = {"nothing_saveable": "full", "checkpoint_dots": "dots_saveable",
            "checkpoint_dots_with_no_batch_dims": "dots_with_no_batch_dims_saveable"}
_PUBLIC = sorted({n for n in dir(jax.checkpoint_policies) if not n.startswith("_")} | {*JAX_POLICIES, *JAX_FACTORIES})


@pytest.mark.parametrize("name", _PUBLIC)
def test_policies_are_registered_as_themselves_and_factories_not_at_all(name):
  fn = getattr(jax.checkpoint_policies, name, None)
  if fn is None:
    pytest.skip(f"jax {jax.__version__} has no checkpoint_policies.{name}")
  # Listed by hand, or (one a newer jax adds) told by how it answers a call.
  is_policy = name in JAX_POLICIES or (name not in JAX_FACTORIES and _decides(fn))
  assert _decides(fn) == is_policy  # the hand-written lists agree with behaviour
  assert remat._is_policy(fn) == is_policy
  if is_policy:
    assert remat.REMAT_POLICIES[name].policy is fn
    assert remat.REMAT_POLICIES[name].alias_of == _ALIASES.get(name)
  else:
    assert name not in remat.REMAT_POLICIES


def test_is_policy_on_functions_of_our_own():
  assert remat._is_policy(lambda prim, *args, **params: True)
  assert remat._is_policy(lambda *_, **__: False)
  assert not remat._is_policy(lambda *names: None)  # save_any_names_but_these's shape
  assert not remat._is_policy(lambda src, dst: None)
  assert not remat._is_policy(lambda: None) and not remat._is_policy("dots_saveable")


def test_registered_builtin_policies_decide_as_their_names_say():
  decide = lambda name, params: remat.REMAT_POLICIES[name].policy(jax.lax.dot_general_p, _A, _B, **params)  # noqa: E731
  assert decide("dots_saveable", _BATCHED) is True and decide("dots_with_no_batch_dims_saveable", _BATCHED) is False
  assert decide("dots_with_no_batch_dims_saveable", _MATMUL) is True
  assert decide("full", _MATMUL) is False and decide("everything_saveable", _MATMUL) is True
  assert remat.REMAT_POLICIES["dots_saveable"].policy(jax.lax.sin_p, _A) is False
  assert remat.REMAT_POLICIES["none"].policy is None  # the baseline has no jax.checkpoint


def _name_primitive():
  return jax.make_jaxpr(lambda x: checkpoint_name(x, "query_proj"))(1.0).eqns[0].primitive


@pytest.mark.parametrize("name", [n for n, p in remat.REMAT_POLICIES.items() if p.saves or p.offloads])
def test_name_presets_save_or_offload_exactly_their_names(name):
  p = remat.REMAT_POLICIES[name]
  name_p = _name_primitive()
  x = jax.ShapeDtypeStruct((4,), jnp.float32)
  decisions = {n: p.policy(name_p, x, name=n) for n in CHECKPOINT_NAMES}
  assert {n for n, d in decisions.items() if d is True} == set(p.saves)
  offloaded = {n for n, d in decisions.items() if type(d).__name__ == "Offloadable"}
  assert offloaded == set(p.offloads)


@pytest.mark.parametrize("name", [n for n, p in remat.REMAT_POLICIES.items() if p.saves or p.offloads])
def test_name_presets_use_model_tags(name):
  p = remat.REMAT_POLICIES[name]
  assert set(p.saves) | set(p.offloads) <= set(CHECKPOINT_NAMES)


def test_full_offloaded_offloads_the_layer_input_the_model_tags():
  """The scanned stack tags each layer's input (MaxText's decoder_layer_input), and under
  full_offloaded the layer's residual for the backward pass is that tag, offloaded: nothing of
  the block is saved on the device (tiny, traced, not compiled)."""
  cfg = get_config("tiny")
  graphdef, params, _ = abstract_model(cfg)
  toks = jax.ShapeDtypeStruct((2, 16), jnp.int32)
  p = remat.REMAT_POLICIES["full_offloaded"]
  assert p.offloads == ("decoder_layer_input",) and p.needs_host_memory and not p.saves

  def loss(params, toks):
    return nnx.merge(graphdef, params).loss(toks, toks, remat=p.policy)

  text = str(jax.make_jaxpr(jax.grad(loss))(params, toks))
  assert "name=decoder_layer_input" in text
  # What goes to host memory (a device_put to a <host> array) is the layer input, [B, T, D],
  # stacked over the layers by the scan, and nothing else.
  d, n = cfg.d_model, cfg.num_layers
  assert set(re.findall(r"(\w+)<host>(\[[\d,]*\])", text)) == {("bf16", f"[2,16,{d}]"), ("bf16", f"[{n},2,16,{d}]")}


# Four layers, 8 x 1024 tokens of width 512: the layer inputs (32 MiB) outgrow v5e's VMEM, where
# the TPU compiler would otherwise keep them whatever the policy. About a minute a compile on a
# loaded 2-core machine.
LONG = dict(
    batch=8, seq=1024, target="tpu:v5e-1", optimizer="sgd",
    model=get_config(
        "tiny", num_layers=4, d_model=512, d_ff=1024, num_heads=4, num_kv_heads=2, head_dim=64, vocab_size=1024
    ),
)


@pytest.mark.slow
@pytest.mark.needs_tpu_compiler
def test_full_offloaded_moves_the_layer_inputs_off_the_device(compile_one):
  full, offloaded = compile_one(**LONG, remat="full"), compile_one(**LONG, remat="full_offloaded")
  assert full.error is None and offloaded.error is None
  layer_inputs = 4 * 8 * 1024 * 512 * 2  # L x B x T x D in bfloat16
  assert offloaded.host_temp_size_in_bytes >= layer_inputs and full.host_temp_size_in_bytes == 0
  assert offloaded.temp_size_in_bytes < full.temp_size_in_bytes
  assert offloaded.required_bytes < full.required_bytes  # judged on the device alone


def test_parse_remat_puts_baseline_first_and_dedupes():
  names = [p.name for p in remat.parse_remat("dots_saveable,full,dots_saveable")]
  assert names == ["none", "dots_saveable", "full"]


def test_parse_remat_all_skips_aliases_and_offload_without_host_memory():
  names = [p.name for p in remat.parse_remat("all", host_memory=False)]
  assert names[0] == "none" and "full" in names and "dots_saveable" in names
  assert "nothing_saveable" not in names and "checkpoint_dots" not in names
  assert not any(remat.REMAT_POLICIES[n].needs_host_memory for n in names)
  assert "qkv_proj_offloaded" in [p.name for p in remat.parse_remat("all", host_memory=True)]


def test_unknown_remat_lists_valid_names():
  with pytest.raises(JaxmemError, match="valid: none, full.*dots_saveable"):
    remat.parse_remat("dots_savable")


def test_unknown_optimizer_lists_valid_names():
  with pytest.raises(JaxmemError, match="unknown optimizer 'adamm'; valid: sgd"):
    optimizers.OPTIMIZERS.parse("adamm")


@pytest.mark.parametrize("name", list(optimizers.OPTIMIZERS))
def test_each_optimizer_declares_the_state_optax_keeps(name):
  # The closed forms read the declaration; optax's own state for a few matrices is the check.
  opt = optimizers.OPTIMIZERS[name]
  params = {"w": jnp.zeros((512, 256)), "stack": jnp.zeros((4, 256, 128)), "bias": jnp.zeros((256,))}
  state = jax.eval_shape(opt.build(1e-3).init, params)
  arrays = [x for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.floating)]
  per_param = sum(x.size for x in arrays) / sum(x.size for x in jax.tree.leaves(params))
  assert opt.state_moments is not None
  assert abs(per_param - opt.state_moments) < 0.1, (per_param, opt.state_moments)
  if opt.state_dtype is not None:
    assert {str(x.dtype) for x in arrays if x.ndim} == {opt.state_dtype}


def test_an_optimizer_without_a_state_declaration_is_refused_by_the_closed_form(monkeypatch):
  from jaxmem.planning.estimate import estimate

  toy = optimizers.Optimizer(name="toy", build=lambda lr: optimizers.OPTIMIZERS["adamw"].build(lr), description="toy")
  monkeypatch.setitem(optimizers.OPTIMIZERS._entries, "toy", toy)
  with pytest.raises(JaxmemError, match="no optimizer state for toy: it declares no `state_moments`"):
    estimate(model="tiny", optimizer="toy")


def test_optimizer_registry_has_the_usual_names():
  assert {"sgd", "momentum", "nesterov", "adam", "adamw", "adamw_bf16", "adafactor", "lion", "lamb"} <= set(
      optimizers.OPTIMIZERS
  )
  assert [o.name for o in optimizers.OPTIMIZERS.parse("all")] == list(optimizers.OPTIMIZERS)
