"""Remat (``jax.checkpoint``) policies by name.

A policy decides which intermediates of a Transformer block are saved for the backward pass;
the rest are recomputed. Three families:

- ``none``: no ``jax.checkpoint`` at all, the baseline every other policy is compared with.
- Every argument-free policy in ``jax.checkpoint_policies``, by its own name (found by
  introspection, so a newer jax adds its new policies here), with ``full`` as the usual name
  for ``nothing_saveable``.
- Presets over the names the models tag with ``checkpoint_name`` (see ``jaxmem.models``),
  following MaxText's ``remat_policy`` vocabulary; the ``*_offloaded`` ones move saved values
  to host memory and need a target with a host memory space.
- ``selective``: Korthikanti et al. 2022's selective activation recomputation (section 4.2):
  the attention core alone under its own ``jax.checkpoint`` (:func:`layer_attend`), the rest
  of the layer saved as without remat.

>>> REMAT_POLICIES.get("save_qkv_proj").saves
('query_proj', 'key_proj', 'value_proj')
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax

from jaxmem.errors import JaxmemError
from jaxmem.models import CHECKPOINT_NAMES, AttendFn, dot_attend
from jaxmem.registry import Registry

cp = jax.checkpoint_policies


@dataclasses.dataclass(frozen=True, kw_only=True)
class RematPolicy:
  name: str
  policy: Callable | None  # None: no jax.checkpoint (the baseline)
  description: str
  saves: tuple[str, ...] = ()  # checkpoint names saved, for name-based presets
  offloads: tuple[str, ...] = ()  # checkpoint names moved to host memory
  alias_of: str | None = None  # same policy under another name: left out of `all`
  needs_host_memory: bool = False
  # Recompute the attention core (q k^T, the softmax and any mask drawn on it, the product with v)
  # under its own jax.checkpoint saving nothing, whatever ``policy`` does with the rest (layer_attend).
  attention_core: bool = False

  def attend(self, attend: AttendFn | None) -> AttendFn | None:
    """The attention function a layer runs under this policy (:func:`layer_attend`)."""
    return layer_attend(attend) if self.attention_core else attend


def layer_attend(attend: AttendFn | None) -> AttendFn:
  """``attend`` (None: dot attention) under ``jax.checkpoint`` saving nothing: its backward pass
  recomputes the scores, the softmax and any mask drawn on the probabilities from q, k, v and the
  mask's key, the way Megatron's ``--recompute-granularity selective`` checkpoints its
  ``core_attention`` (Korthikanti et al. 2022, section 4.2; the same key draws the same mask
  again)."""
  attend = dot_attend if attend is None else attend

  def run(q, k, v, *, causal: bool = True, **layer):
    # layer: the layer's own attention features (a window, soft-capping, sinks: attention_ops),
    # and any that draws from a PRNG key (a frozen dataclass with a `key`: the probabilities'
    # mask), whose key is an argument of the checkpointed core so that it is kept, not the mask.
    keyed = {n: o for n, o in layer.items() if isinstance(getattr(o, "key", None), jax.Array)}
    fixed = {n: o for n, o in layer.items() if n not in keyed}

    def core(q, k, v, keys):
      drawn = {n: dataclasses.replace(o, key=keys[n]) for n, o in keyed.items()}
      return attend(q, k, v, causal=causal, **fixed, **drawn)

    keys = {n: o.key for n, o in keyed.items()}
    return jax.checkpoint(core, policy=cp.nothing_saveable, prevent_cse=False)(q, k, v, keys)

  return run


# Why each built-in policy is worth comparing, in one line.
_BUILTIN_WHY = {
    "nothing_saveable": "save nothing, recompute the whole block: least memory, most recompute",
    "everything_saveable": "save every intermediate: like no remat, but through jax.checkpoint",
    "dots_saveable": "save every matmul output, recompute the elementwise ops",
    "dots_with_no_batch_dims_saveable": "save matmuls without batch dims (projections), recompute attention scores",
}
_BUILTIN_ALIASES = {
    "checkpoint_dots": "dots_saveable",
    "checkpoint_dots_with_no_batch_dims": "dots_with_no_batch_dims_saveable",
}


def _is_policy(fn: object) -> bool:
  """True for a policy itself (called per primitive), False for a policy factory."""
  if not callable(fn):
    return False
  try:
    params = list(inspect.signature(fn).parameters.values())
  except (TypeError, ValueError):
    return False
  # Policies are called as policy(prim, *args, **params); factories take named arguments.
  # (`save_any_names_but_these(*names)` is a factory with only *args: it takes no **params.)
  kinds = {p.kind for p in params}
  return bool(params) and (
      params[0].name == "prim"
      or {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD} <= kinds
  )


def _names_preset(name: str, saves: tuple[str, ...], why: str) -> RematPolicy:
  return RematPolicy(name=name, policy=cp.save_only_these_names(*saves), description=why, saves=saves)


_QKV = ("query_proj", "key_proj", "value_proj")
# MaxText's `minimal` (src/MaxText/layers/decoders.py, Decoder.minimal_policy):
# save_only_these_names("query_proj", "value_proj", "key_proj", "qkv_proj", "out_proj", "mlpwi_0",
# "mlpwi_1", "mlpwi", "mlpwo"): every projection's output, before any activation, and not the
# attention context. MaxText's "qkv_proj" (a fused projection) and "mlpwi" (a fused or single
# MLP input projection, before its activation) have no jaxmem counterpart under those names:
# jaxmem's "mlpwi" is the MLP hidden *after* the activation, which minimal does not save, and
# its MLP input projections before the activation are "mlpwi_0" (GELU's only one, SwiGLU's gate)
# and "mlpwi_1" (SwiGLU's up). So the same tensors are saved under jaxmem's names.
_MINIMAL = (*_QKV, "out_proj", "mlpwi_0", "mlpwi_1", "mlpwo")
# MaxText's MoE layers tag their routed experts with the dense MLP's names as well (layers/moe.py:
# checkpoint_name(checkpoint_name(x, "mlpwi_0"), "moe_mlpwi_0"), and "mlpwi_1", "mlpwo" alike),
# so its presets that save an MLP name save the experts' tensor too; jaxmem's experts carry the
# moe_ names only, so the presets name both.
_MINIMAL += ("moe_mlpwi_0", "moe_mlpwi_1", "moe_mlpwo")


def _build() -> dict[str, RematPolicy]:
  reg: dict[str, RematPolicy] = {
      "none": RematPolicy(name="none", policy=None, description="no jax.checkpoint: every residual saved (baseline)"),
      "full": RematPolicy(name="full", policy=cp.nothing_saveable, description=_BUILTIN_WHY["nothing_saveable"]),
  }
  for attr in sorted(dir(cp)):
    fn = getattr(cp, attr)
    if attr.startswith("_") or not _is_policy(fn):
      continue
    alias = _BUILTIN_ALIASES.get(attr) or ("full" if attr == "nothing_saveable" else None)
    reg[attr] = RematPolicy(
        name=attr,
        policy=fn,
        description=_BUILTIN_WHY.get(attr, f"jax.checkpoint_policies.{attr}"),
        alias_of=alias,
    )
  # MaxText's name-based presets over the tags of jaxmem.models.
  for p in (
      _names_preset("save_qkv_proj", _QKV, "save the q/k/v projections, recompute the rest"),
      _names_preset("save_out_proj", ("out_proj",), "save the attention output projection only"),
      _names_preset("save_dot_except_mlp", (*_QKV, "out_proj"), "save the attention projections, recompute the MLP"),
      _names_preset(
          "save_dot_except_mlpwi", (*_QKV, "out_proj", "mlpwo", "moe_mlpwo"),
          "save all projections except the MLP's wide input (the experts' output too)",
      ),
      _names_preset(
          "save_dot_with_context_except_mlp",
          (*_QKV, "context", "out_proj"),
          "save the attention projections and context, recompute the MLP",
      ),
      _names_preset("minimal", _MINIMAL, "MaxText's minimal: save every projection (experts' too), recompute attention and activations"),
      _names_preset(
          "minimal_with_context", (*_MINIMAL, "context"), "MaxText's minimal_with_context: minimal plus the attention output"
      ),
  ):
    reg[p.name] = p
  reg["qkv_proj_offloaded"] = RematPolicy(
      name="qkv_proj_offloaded",
      policy=cp.save_and_offload_only_these_names(
          names_which_can_be_saved=[],
          names_which_can_be_offloaded=list(_QKV),
          offload_src="device",
          offload_dst="pinned_host",
      ),
      description="move the q/k/v projections to host memory, recompute the rest",
      offloads=_QKV,
      needs_host_memory=True,
  )
  # Each layer's input to host memory, everything else recomputed: the long-context preset.
  # Under `full` the layer inputs, L x [B, T, D], are all that stays on the device
  # between the passes; here they go to pinned host memory as the forward pass makes them and
  # come back one layer at a time in the backward pass. MaxText offloads the same tensor by name
  # (remat_policy "custom" with decoder_layer_input: offload).
  layer_input = "decoder_layer_input"  # jaxmem.models.names.DECODER_LAYER_INPUT
  reg["full_offloaded"] = RematPolicy(
      name="full_offloaded",
      policy=cp.save_and_offload_only_these_names(
          names_which_can_be_saved=[],
          names_which_can_be_offloaded=[layer_input],
          offload_src="device",
          offload_dst="pinned_host",
      ),
      description="move each layer's input to host memory, recompute everything else",
      offloads=(layer_input,),
      needs_host_memory=True,
  )
  # Korthikanti et al. 2022, section 4.2: the attention core's 5as^2b bytes per layer (scores,
  # softmax, the mask drawn on it) are most of a long sequence's activations but few of its FLOPs, so
  # recompute exactly those and keep everything else (policy None: the rest as with no remat).
  reg["selective"] = RematPolicy(
      name="selective",
      policy=None,
      description="Korthikanti et al.'s selective recomputation: recompute the attention core (QK^T, softmax, "
      "its mask, attention over V), keep the rest",
      attention_core=True,
  )
  reg["minimal_offloaded"] = RematPolicy(
      name="minimal_offloaded",
      policy=cp.offload_dot_with_no_batch_dims(offload_src="device", offload_dst="pinned_host"),
      description="move matmuls without batch dims to host memory",
      needs_host_memory=True,
  )
  return reg


# `all` leaves out a policy registered under a second name (nothing_saveable is `full`).
REMAT_POLICIES: Registry[RematPolicy] = Registry(
    "remat policy", _build(), field="remat", in_all=lambda p: p.alias_of is None
)


# A per-tensor assignment's name (fit's per-tensor search, jaxmem.planning.tensors): the checkpoint
# names saved on the device and those moved to host memory; every other name is recomputed.
# "+" joins names and ":" parts (no commas: a remat list is comma separated), sorted, so one
# assignment has one name in rows and in the row cache's key.
ASSIGNMENT_PREFIX = "names:"
SEARCH = "search"  # `remat search`: fit's per-tensor search, not a policy


def assignment_name(saves: Sequence[str], offloads: Sequence[str] = ()) -> str:
  """``names:save=a+b:offload=c`` (a part left out when empty; ``names:`` saves nothing)."""
  parts = [f"{kind}={'+'.join(sorted(set(ns)))}" for kind, ns in (("save", saves), ("offload", offloads)) if ns]
  return ASSIGNMENT_PREFIX + ":".join(parts)


def assignment_policy(name: str) -> RematPolicy:
  """The policy a ``names:save=...:offload=...`` name describes:
  ``save_and_offload_only_these_names`` (what the ``*_offloaded`` presets use), offloaded values
  from the device to pinned host memory. Unknown names or parts are one-line errors."""
  chosen: dict[str, tuple[str, ...]] = {"save": (), "offload": ()}
  for part in filter(None, name.removeprefix(ASSIGNMENT_PREFIX).split(":")):
    kind, eq, names = part.partition("=")
    if not eq or kind not in chosen or chosen[kind]:
      raise JaxmemError(f"remat {name!r}: parts are save=NAME+NAME and offload=NAME+NAME, each once (got {part!r})")
    chosen[kind] = tuple(n for n in names.split("+") if n)
    unknown = [n for n in chosen[kind] if n not in CHECKPOINT_NAMES]
    if unknown:
      raise JaxmemError(f"remat {name!r}: unknown checkpoint name {unknown[0]!r}; valid: {', '.join(CHECKPOINT_NAMES)}")
  saves, offloads = chosen["save"], chosen["offload"]
  if set(saves) & set(offloads):
    raise JaxmemError(f"remat {name!r}: {sorted(set(saves) & set(offloads))[0]} is both saved and offloaded")
  canonical = assignment_name(saves, offloads)
  if offloads:
    policy = cp.save_and_offload_only_these_names(
        names_which_can_be_saved=list(saves), names_which_can_be_offloaded=list(offloads),
        offload_src="device", offload_dst="pinned_host",
    )
  else:
    policy = cp.save_only_these_names(*saves)
  return RematPolicy(
      name=canonical, policy=policy, saves=tuple(sorted(set(saves))), offloads=tuple(sorted(set(offloads))),
      description="a per-tensor assignment: the names saved" + (", those offloaded to host memory" if offloads else "")
      + ", the rest recomputed",
      needs_host_memory=bool(offloads),
  )


# MaxText's ``remat_policy=custom`` (configs/base.yml, configs/types.py): each of its checkpoint
# names placed ``remat``, ``device`` or ``offload``, written here ``custom:NAME=PLACE:NAME=PLACE``.
CUSTOM_PREFIX = "custom:"
CUSTOM_PLACES = ("remat", "device", "offload")
# MaxText's names that tag the same tensor in jaxmem's models (jaxmem.models.names). Not
# ``mlpwi``: jaxmem's is the MLP hidden after its activation, MaxText's a fused input projection
# before it (see CUSTOM_FUSED). jaxmem.maxtext.emit writes a per-tensor assignment back with these.
CUSTOM_TENSORS = ("decoder_layer_input", "context", "mlpwi_0", "mlpwi_1", "mlpwo", "moe_mlpwi_0", "moe_mlpwi_1",
                  "moe_mlpwo", "query_proj", "key_proj", "value_proj", "query_wa_proj", "kv_wa_proj", "mla_kv",
                  "mla_q", "out_proj")
# MaxText's names for fused projections (fused_qkv, fused_mlp; layers/attentions.py, linears.py):
# the same bytes as jaxmem's separate ones, so placing the fused name places all of them.
CUSTOM_FUSED = {"qkv_proj": _QKV, "kv_proj": ("key_proj", "value_proj"), "mlpwi": ("mlpwi_0", "mlpwi_1")}
# MaxText tags its routed experts with the dense MLP's names too (layers/moe.py nests
# checkpoint_name(..., "mlpwi_0") inside "moe_mlpwi_0"), so placing a dense MLP name places the
# experts' tensor as well, as the presets above do.
_CUSTOM_ALSO = {"mlpwi_0": ("moe_mlpwi_0",), "mlpwi_1": ("moe_mlpwi_1",), "mlpwo": ("moe_mlpwo",)}
# MaxText's names with no tensor in jaxmem's models (the DeepSeek-V3.2 indexer, MoE routing
# metadata, MLA's attention output, Engram): ``remat`` (their default) is what they are here.
CUSTOM_ABSENT = ("indexer_cutoff_threshold", "moe_x_sorted", "moe_routing_maps", "attention_out", "engram")
CUSTOM_NAMES = (*CUSTOM_TENSORS, *CUSTOM_FUSED, *CUSTOM_ABSENT)  # every name the map takes


def custom_policy(name: str) -> RematPolicy:
  """MaxText's ``custom`` map, ``custom:query_proj=offload:mlpwo=device``, as the per-tensor
  assignment it saves and offloads in jaxmem's names (every name left out is MaxText's default:
  ``decoder_layer_input`` on the device, the rest ``remat``). The layer input on the device is
  what every policy keeps (it is the scanned layer's checkpointed argument); MaxText refuses it
  ``remat`` under scanned layers, and so does this. Unknown names or places are one-line errors."""
  places: dict[str, str] = {}
  for part in filter(None, name.removeprefix(CUSTOM_PREFIX).split(":")):
    key, eq, place = part.partition("=")
    if not eq or place not in CUSTOM_PLACES:
      raise JaxmemError(f"remat {name!r}: each part is NAME=PLACE, PLACE one of {', '.join(CUSTOM_PLACES)} (got {part!r})")
    if key not in CUSTOM_NAMES:
      raise JaxmemError(f"remat {name!r}: {key!r} is not a name of MaxText's custom policy; valid: "
                        f"{', '.join(CUSTOM_NAMES)}")
    if key in places:
      raise JaxmemError(f"remat {name!r}: {key} is placed twice")
    places[key] = place
  if places.get("decoder_layer_input") == "remat":
    raise JaxmemError(f"remat {name!r}: decoder_layer_input cannot be remat: the scanned layers keep it as their "
                      "checkpoint (MaxText refuses it too)")
  chosen: dict[str, str] = {}
  for key, place in places.items():
    if place == "remat" or (key == "decoder_layer_input" and place == "device"):
      continue
    if key in CUSTOM_ABSENT:
      raise JaxmemError(f"remat {name!r}: jaxmem's models have no tensor MaxText calls {key}, so it cannot be "
                        f"placed {place}")
    for n in (*CUSTOM_FUSED.get(key, (key,)), *_CUSTOM_ALSO.get(key, ())):
      if chosen.setdefault(n, place) != place:
        raise JaxmemError(f"remat {name!r}: {n} is placed both {chosen[n]} and {place} (through {key})")
  saves = [n for n, p in chosen.items() if p == "device"]
  offloads = [n for n, p in chosen.items() if p == "offload"]
  return assignment_policy(assignment_name(saves, offloads))


def get_remat(name: str) -> RematPolicy:
  """A registry policy, a per-tensor assignment by its ``names:`` name, or MaxText's ``custom:``
  map (:func:`custom_policy`)."""
  if name.startswith(ASSIGNMENT_PREFIX):
    return assignment_policy(name)
  if name.startswith(CUSTOM_PREFIX):
    return custom_policy(name)
  if name == SEARCH:
    raise JaxmemError("`remat` search is fit's per-tensor search (`jaxmem.remat_search`, or fit with `remat` search "
                      "and a fixed `batch` and `seq`), not a policy")
  return REMAT_POLICIES.get(name)


def parse_remat(spec: str | Sequence[str], *, host_memory: bool = True) -> list[RematPolicy]:
  """``"a,b"`` or ``"all"`` to policies; ``none`` is always first (the baseline). ``all`` leaves
  out the host-offload policies when the target has no host memory space. A ``names:`` part is a
  per-tensor assignment (:func:`assignment_policy`), a ``custom:`` part MaxText's per-tensor map
  (:func:`custom_policy`)."""
  parts = [spec] if isinstance(spec, str) else list(spec)
  names = [n.strip() for p in parts for n in p.split(",") if n.strip()]
  if any(n.startswith((ASSIGNMENT_PREFIX, CUSTOM_PREFIX)) or n == SEARCH for n in names):
    chosen = list({rp.name: rp for rp in map(get_remat, names)}.values())
  else:
    chosen = list(REMAT_POLICIES.parse(spec, all_filter=lambda p: host_memory or not p.needs_host_memory))
  for p in chosen:
    if p.needs_host_memory and not host_memory:
      instead = assignment_name(p.saves + p.offloads) if p.name.startswith(ASSIGNMENT_PREFIX) else on_device(p.name)
      raise JaxmemError(
          f"remat {p.name} offloads to host memory, and the target has no host memory space; "
          f"use {instead}, the same policy kept on the device"
      )
  if chosen[0].name != "none":
    chosen = [REMAT_POLICIES["none"], *[p for p in chosen if p.name != "none"]]
  return chosen


def on_device(name: str) -> str:
  """The policy an offloading one becomes when nothing can leave the device: the same names
  saved on the device (``minimal_offloaded`` -> ``minimal``, ``qkv_proj_offloaded`` ->
  ``save_qkv_proj``), else ``full`` (``full_offloaded`` recomputes all but the layer input)."""
  base = name.removesuffix("_offloaded")
  return next((n for n in (base, f"save_{base}") if n in REMAT_POLICIES and n != name), "full")


def jaxpr_eqns(jaxpr: object) -> Iterator[Any]:
  """Every equation of ``jaxpr``, inner jaxprs (remat, scan, cond, pjit, custom rules) included."""
  todo = [jaxpr]
  while todo:
    j = todo.pop()
    for eqn in getattr(j, "eqns", ()):
      yield eqn
      for value in eqn.params.values():
        for sub in value if isinstance(value, (list, tuple)) else (value,):
          inner = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's jaxpr, or a Jaxpr itself
          if hasattr(inner, "eqns"):
            todo.append(inner)


def checkpoint_names_in(jaxpr: object) -> frozenset[str]:
  """The names ``jax.ad_checkpoint.checkpoint_name`` gives values anywhere in ``jaxpr`` (the
  ``name`` primitive's ``name`` parameter)."""
  return frozenset(
      e.params["name"] for e in jaxpr_eqns(jaxpr) if e.primitive.name == "name" and isinstance(e.params.get("name"), str)
  )


def names_note(rp: RematPolicy, found: frozenset[str]) -> str | None:
  """A note where ``rp`` saves or offloads by checkpoint name and the program (whose names are
  ``found``) has none of its names: then it saves nothing a name marks and acts as ``full``."""
  wanted = set(rp.saves) | set(rp.offloads)
  if not wanted or wanted & found:
    return None
  return (
      f"checkpoint names: remat {rp.name} saves tensors by name and the step's program has none of its names "
      f"(missing: {', '.join(sorted(wanted))}; found: {', '.join(sorted(found)) or 'none'}), so it saves nothing "
      "and recomputes like full; tag your tensors with jax.ad_checkpoint.checkpoint_name to use it"
  )
