"""jaxmem.program.sharding: mesh strings, logical-axis rules and the shardings they give, on a
mesh of the CPU devices conftest.py simulates (8). Nothing here compiles."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxmem.errors import JaxmemError
from jaxmem.program import sharding as shd


def _mesh(**axes: int) -> Mesh:
  """A jax Mesh over the first prod(sizes) CPU devices, axes in the order given."""
  n = int(np.prod(list(axes.values())))
  return Mesh(np.array(jax.devices("cpu")[:n]).reshape(tuple(axes.values())), tuple(axes))


# -- mesh strings ---------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "spec,expected",
    [
        ("data=4", (("data", 4),)),
        ("fsdp=2, tensor=2", (("fsdp", 2), ("tensor", 2))),
        (" sequence=2 ,data=1,", (("sequence", 2), ("data", 1))),  # spaces and a trailing comma
        ("data=2,fsdp=2,tensor=2", (("data", 2), ("fsdp", 2), ("tensor", 2))),
    ],
)
def test_parse_mesh_keeps_the_order_given(spec, expected):
  mesh = shd.parse_mesh(spec)
  assert mesh == expected
  assert shd.parse_mesh(shd.format_mesh(mesh)) == mesh  # format_mesh writes what parse_mesh reads


@pytest.mark.parametrize(
    "spec,match",
    [
        ("data", "axis=size"),
        ("data=x", "axis=size"),
        ("data=-2", "axis=size"),
        ("data=2.5", "axis=size"),
        ("pipeline=2", "unknown axis 'pipeline'; valid axes: data, stage, fsdp, tensor, sequence"),
        ("data=2,data=2", "given twice"),
        ("data=0", "at least 1"),
        ("", "at least one axis"),
        (" , ", "at least one axis"),
    ],
)
def test_bad_mesh_says_what_and_how(spec, match):
  with pytest.raises(JaxmemError, match=match) as info:
    shd.parse_mesh(spec)
  assert repr(spec) in str(info.value) and "\n" not in str(info.value)


def test_mesh_sizes():
  mesh = shd.parse_mesh("data=2,fsdp=4,tensor=2,sequence=3")
  assert shd.mesh_size(mesh) == 48
  # The batch is split by data and fsdp, not by tensor or sequence.
  assert shd.data_parallel_size(mesh) == 8
  assert shd.data_parallel_size(shd.parse_mesh("tensor=4")) == 1
  assert shd.default_mesh(8) == (("fsdp", 8),)  # MaxText's default: FSDP over every device


# -- logical_to_spec ------------------------------------------------------------------------------

def test_weights_shard_embed_over_fsdp_and_heads_over_tensor():
  mesh = _mesh(fsdp=4, tensor=2)
  spec = shd.logical_to_spec(("embed", "heads", "head_dim"), (256, 8, 64), mesh, shd.PARAM_RULES, what="w_q")
  assert spec == P("fsdp", "tensor", None)
  # A name without a rule (and None) stays unsharded.
  assert shd.logical_to_spec((None, "layers"), (4, 4), mesh, shd.PARAM_RULES, what="x") == P(None, None)


def test_an_axis_of_size_one_or_absent_shards_nothing():
  mesh = _mesh(data=4, tensor=1)
  assert shd.logical_to_spec(("embed", "mlp"), (6, 6), mesh, shd.PARAM_RULES, what="w") == P(None, None)


def test_batch_splits_over_data_and_fsdp_together():
  mesh = _mesh(data=2, fsdp=4)
  spec = shd.logical_to_spec(("batch", "seq", "embed"), (8, 16, 32), mesh, shd.ACTIVATION_RULES, what="x")
  assert spec == P(("data", "fsdp"), None, None)


def test_a_mesh_axis_shards_one_dimension_only():
  # heads and mlp both map to tensor; the second gets nothing (a PartitionSpec may not name an
  # axis twice).
  mesh = _mesh(tensor=2)
  spec = shd.logical_to_spec(("heads", "mlp"), (4, 8), mesh, shd.PARAM_RULES, what="w")
  assert spec == P("tensor", None)


@pytest.mark.parametrize(
    "logical,shape,axes,message",
    [
        (("embed",), (6,), dict(fsdp=4), "parameter w: dimension embed=6 is not divisible by mesh fsdp=4; pick axis sizes that divide 6"),
        (("vocab", "embed"), (255, 8), dict(tensor=2), "dimension vocab=255 is not divisible by mesh tensor=2; pick axis sizes that divide 255 (or pad the vocabulary)"),
        (("batch",), (6,), dict(data=2, fsdp=2), "dimension batch=6 is not divisible by mesh data=2 x fsdp=2 = 4"),
    ],
)
def test_indivisible_dimension_is_one_line_naming_it(logical, shape, axes, message):
  rules = shd.ACTIVATION_RULES if logical == ("batch",) else shd.PARAM_RULES
  with pytest.raises(JaxmemError) as info:
    shd.logical_to_spec(logical, shape, _mesh(**axes), rules, what="parameter w")
  assert message in str(info.value) and "\n" not in str(info.value)


def test_lenient_spec_leaves_indivisible_dimensions_unsharded_and_says_which():
  mesh = _mesh(fsdp=2, tensor=4)
  spec, left = shd.lenient_spec(("batch", "seq", "kv_heads", "head_dim"), (8, 16, 2, 64), mesh)
  assert spec == P("fsdp", None, None, None)
  assert left == [("kv_heads", 2, ("tensor",), 4)]
  # The next dimension may still take the axis the indivisible one could not use.
  spec, left = shd.lenient_spec(("kv_heads", "mlp"), (2, 8), mesh)
  assert spec == P(None, "tensor") and [name for name, *_ in left] == ["kv_heads"]


# -- trees ------------------------------------------------------------------------------------------

def _params():
  params = {
      "embed": {"table_vd": jax.ShapeDtypeStruct((64, 32), jnp.float32)},
      "blocks": {"w_in_df": jax.ShapeDtypeStruct((32, 128), jnp.float32), "scale_d": jax.ShapeDtypeStruct((32,), jnp.float32)},
  }
  logical = {
      "embed": {"table_vd": P("vocab", "embed")},
      "blocks": {"w_in_df": P("embed", "mlp"), "scale_d": P("norm")},
  }
  return params, logical


def test_param_shardings_follow_the_rules():
  mesh = _mesh(fsdp=4, tensor=2)
  params, logical = _params()
  sh = shd.param_shardings(params, logical, mesh)
  assert sh["embed"]["table_vd"] == NamedSharding(mesh, P("tensor", "fsdp"))
  assert sh["blocks"]["w_in_df"] == NamedSharding(mesh, P("fsdp", "tensor"))
  assert sh["blocks"]["scale_d"].spec == P(None)
  # Bytes per device: each sharded matrix is split 8 ways, the norm scale not at all.
  per_device = sum(np.prod(s.shard_shape(p.shape)) * 4 for p, s in zip(jax.tree.leaves(params), jax.tree.leaves(sh)))
  assert per_device == (64 * 32 + 32 * 128) * 4 // 8 + 32 * 4


def test_param_shardings_error_names_the_parameter():
  params, logical = _params()
  with pytest.raises(JaxmemError, match=r"parameter blocks/w_in_df: dimension embed=32 is not divisible by mesh fsdp=3"):
    shd.param_shardings({"blocks": {"w_in_df": jax.ShapeDtypeStruct((32, 128), jnp.float32)}},
                        {"blocks": {"w_in_df": P("embed", "mlp")}}, Mesh(np.array(jax.devices("cpu")[:3]), ("fsdp",)))


def test_optimizer_state_is_sharded_like_its_parameter_else_replicated():
  mesh = _mesh(fsdp=4, tensor=2)
  params, logical = _params()
  sh = shd.param_shardings(params, logical, mesh)
  for tx in (optax.adamw(1e-3), optax.adafactor(1e-3)):
    state = jax.eval_shape(tx.init, params)
    st = shd.state_shardings(state, params, sh, mesh)
    by_shape = {}
    for leaf, s in zip(jax.tree.leaves(state), jax.tree.leaves(st), strict=True):
      by_shape.setdefault(tuple(leaf.shape), set()).add(s.spec)
    # Moments shaped like a weight take the weight's spec; counts and factored statistics
    # (adafactor's row/column vectors) are replicated.
    if (32, 128) in by_shape:
      assert by_shape[(32, 128)] == {P("fsdp", "tensor")}
    for shape, specs in by_shape.items():
      if shape not in ((64, 32), (32, 128), (32,)):
        assert specs == {P()}, shape
  adam = shd.state_shardings(jax.eval_shape(optax.adamw(1e-3).init, params), params, sh, mesh)
  mu = adam[0].mu
  assert mu["embed"]["table_vd"] == sh["embed"]["table_vd"] and mu["blocks"]["w_in_df"] == sh["blocks"]["w_in_df"]
  assert adam[0].count.spec == P()


def test_activation_constrainer_pins_activations_to_the_mesh():
  mesh = _mesh(data=2, tensor=4)
  constrain = shd.activation_constrainer(mesh)
  x = jax.ShapeDtypeStruct((8, 16, 2, 64), jnp.float32)
  jaxpr = jax.make_jaxpr(lambda x: constrain(x, ("batch", "seq", "kv_heads", "head_dim")))(x)
  (eqn,) = [e for e in jaxpr.eqns if e.primitive.name == "sharding_constraint"]
  # kv_heads=2 does not divide over tensor=4: left unsharded (replicated) rather than refused.
  assert eqn.params["sharding"].spec == P("data", None, None, None)
