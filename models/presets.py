"""The named presets and lookup by CLI name: a preset, or a Hugging Face ``config.json`` path.

Kept apart from :mod:`.config` (the dataclass and its presets as classmethods) because reading a
``config.json`` (:mod:`.hf`) needs ``ModelConfig``, and lookup needs both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from jaxmem.errors import JaxmemError
from jaxmem.inputs import Text, optional
from jaxmem.registry import Registry

from .config import ModelConfig, StepChoices
from .hf import from_config
from .hub import config_path, parse_hub_id

# CLI name -> preset constructor. Constructors rather than instances so callers always get a
# fresh value to `dataclasses.replace`, and the dict stays cheap to import.
_PRESETS: dict[str, Callable[[], ModelConfig]] = {
  "tiny": ModelConfig.tiny,
  "tiny-gpt2": ModelConfig.tiny_gpt2,
  "gpt2-small": ModelConfig.gpt2_small,
  "gpt2-medium": ModelConfig.gpt2_medium,
  "gpt2-large": ModelConfig.gpt2_large,
  "gpt2-xl": ModelConfig.gpt2_xl,
  "llama3-1b": ModelConfig.llama3_1b,
  "llama3-3b": ModelConfig.llama3_3b,
  "llama3-8b": ModelConfig.llama3_8b,
  "llama3-70b": ModelConfig.llama3_70b,
  "llama3-405b": ModelConfig.llama3_405b,
  "mistral-7b": ModelConfig.mistral_7b,
  "qwen2.5-7b": ModelConfig.qwen2_5_7b,
  "qwen2.5-72b": ModelConfig.qwen2_5_72b,
  "qwen3-8b": ModelConfig.qwen3_8b,
  # Mixture of experts / multi-head latent attention.
  "tiny-moe": ModelConfig.tiny_moe,
  "tiny-mla": ModelConfig.tiny_mla,
  "mixtral-8x7b": ModelConfig.mixtral_8x7b,
  "mixtral-8x22b": ModelConfig.mixtral_8x22b,
  "qwen3-30b-a3b": ModelConfig.qwen3_30b_a3b,
  "deepseek-v3": ModelConfig.deepseek_v3,
  # The GPT-3 shapes of Korthikanti et al. 2022, table 3.
  "gpt3-22b": ModelConfig.gpt3_22b,
  "gpt3-175b": ModelConfig.gpt3_175b,
  "gpt3-530b": ModelConfig.gpt3_530b,
  "gpt3-1t": ModelConfig.gpt3_1t,
}

# A read-only Mapping with the same get/parse and one-line errors as the other registries.
PRESETS: Registry[Callable[[], ModelConfig]] = Registry("model", _PRESETS, flag="model")


def get_config(name: str, **overrides: Any) -> ModelConfig:
  """The preset called ``name`` (a key of ``PRESETS``), or the model a Hugging Face-style
  ``config.json`` describes when ``name`` is a path ending in ``.json`` (see
  :func:`models.hf.from_config`) or a Hub id ``ORG/NAME[@REVISION]`` (only its config.json is
  fetched, :mod:`.hub`), with fields replaced by ``overrides``.

  Raises:
    JaxmemError: unknown preset name, unknown field, an unreadable or unsupported config
      file, or an override that makes the config invalid; the message is one line and lists
      what is valid.
  """
  hub = None if name in PRESETS else parse_hub_id(name)
  if isinstance(name, str) and name.lower().endswith(".json"):
    cfg = from_config(name)
  elif hub is not None:
    repo, revision = hub
    cfg = from_config(config_path(repo, revision=revision), name=repo)
  elif name not in PRESETS:
    raise JaxmemError(
      f"unknown model {name!r}; valid models: {', '.join(PRESETS)}, a path to a Hugging Face config.json, "
      "or a Hub id ORG/NAME[@REVISION]"
    )
  else:
    cfg = PRESETS[name]()
  if not overrides:
    return cfg
  fields = ModelConfig.flat_fields()
  unknown = sorted(set(overrides) - set(fields))
  steps = [k for k in unknown if k in {f.name for f in dataclasses.fields(StepChoices)}]
  if steps:
    raise JaxmemError(
      f"{', '.join(steps)}: how a step runs the model, not a model field; give it as StepChoices({steps[0]}=...) "
      "beside the config (the workload's axis of that name)"
    )
  if unknown:
    raise JaxmemError(f"unknown model field(s) {', '.join(unknown)}; valid fields: {', '.join(fields)}")
  return dataclasses.replace(cfg, **overrides)


def load_model(name: str, *, revision: str | None = None, **overrides: Any) -> ModelConfig:
  """The ModelConfig of a preset, a ``config.json`` path, or a Hugging Face Hub id
  (``jaxmem.load_model("google/gemma-3-27b-it")``; only the repository's config.json is fetched,
  honouring ``HF_TOKEN``, the local Hub cache and ``HF_HUB_OFFLINE``: see :mod:`.hub`).
  ``revision`` is a branch, tag or commit of a Hub id (the same as ``ORG/NAME@REVISION``)."""
  name = Text(expected="a preset's name, a config.json path or a Hub id ORG/NAME")(name, "`name`")
  revision = optional(Text(), revision, "`revision`")
  if revision is not None:
    if parse_hub_id(name) is None or "@" in name:
      raise JaxmemError(f"revision applies to a Hub id ORG/NAME without @REVISION, got {name!r}")
    name = f"{name}@{revision}"
  return get_config(name, **overrides)
