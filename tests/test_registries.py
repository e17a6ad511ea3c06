"""Remat and optimizer registries, and mesh parsing: names, errors, and what `all` means."""

import inspect

import jax
import pytest

from jaxmem.errors import JaxmemError
from jaxmem.inference.quant import WEIGHT_FORMATS
from jaxmem.models import CHECKPOINT_NAMES, PRESETS
from jaxmem.program import optimizers, remat, sharding
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
  with pytest.raises(JaxmemError, match="--colors is empty"):
    COLORS.parse(" , ")


@pytest.mark.parametrize("registry,kind", [(remat.REMAT_POLICIES, "remat policy"), (optimizers.OPTIMIZERS, "optimizer"),
                                           (WEIGHT_FORMATS, "weight format"), (PRESETS, "model")])
def test_every_registry_answers_alike(registry, kind):
  first = next(iter(registry))
  assert registry.get(first) is registry[first]
  with pytest.raises(JaxmemError, match=f"unknown {kind} 'nope'; valid: {first}"):
    registry.parse(f"{first},nope")


def test_every_argument_free_jax_policy_is_registered():
  for name in dir(jax.checkpoint_policies):
    fn = getattr(jax.checkpoint_policies, name)
    if name.startswith("_") or not callable(fn):
      continue
    params = list(inspect.signature(fn).parameters.values())
    kinds = {p.kind for p in params}
    if params[0].name == "prim" or {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD} <= kinds:
      assert name in remat.REMAT_POLICIES, name


def test_factories_are_not_registered_as_policies():
  for factory in (
      "save_only_these_names",
      "save_any_names_but_these",
      "save_anything_except_these_names",
      "save_and_offload_only_these_names",
      "save_from_both_policies",
  ):
    assert factory not in remat.REMAT_POLICIES


@pytest.mark.parametrize("name", [n for n, p in remat.REMAT_POLICIES.items() if p.saves or p.offloads])
def test_name_presets_use_model_tags(name):
  p = remat.REMAT_POLICIES[name]
  assert set(p.saves) | set(p.offloads) <= set(CHECKPOINT_NAMES)


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


def test_optimizer_registry_has_the_usual_names():
  assert {"sgd", "momentum", "nesterov", "adam", "adamw", "adamw_bf16", "adafactor", "lion", "lamb"} <= set(
      optimizers.OPTIMIZERS
  )
  assert [o.name for o in optimizers.OPTIMIZERS.parse("all")] == list(optimizers.OPTIMIZERS)


@pytest.mark.parametrize(
    "spec,expected",
    [("data=4", (("data", 4),)), ("fsdp=2, tensor=2", (("fsdp", 2), ("tensor", 2))), ("data=2,fsdp=2,tensor=2", None)],
)
def test_parse_mesh(spec, expected):
  mesh = sharding.parse_mesh(spec)
  if expected is not None:
    assert mesh == expected
  assert sharding.mesh_size(mesh) == (4 if expected else 8)


@pytest.mark.parametrize(
    "spec,match",
    [
        ("data", "axis=size"),
        ("data=x", "axis=size"),
        ("pipeline=2", "unknown axis 'pipeline'"),
        ("data=2,data=2", "given twice"),
        ("data=0", "at least 1"),
        ("", "at least one axis"),
    ],
)
def test_bad_mesh(spec, match):
  with pytest.raises(JaxmemError, match=match):
    sharding.parse_mesh(spec)
