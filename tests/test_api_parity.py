"""The Python API answers as the CLI does: a target by name resolved once for every entry point
(capacity, verdict, the arguments' check, notes)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import jaxmem
from jaxmem.errors import JaxmemError
from jaxmem.hardware.targets import get_target, resolved_target
from jaxmem.resolve import resolve_target
from jaxmem.workload import Workload


# ----------------------------------------------------------------------------- one target resolution


@pytest.mark.needs_tpu_compiler
def test_every_entry_point_resolves_a_target_name_alike():
  named = resolved_target("tpu:v5p-8")
  assert named.capacity_bytes is not None and named.capacity_bytes == jaxmem.target("tpu:v5p-8").capacity_bytes
  assert resolve_target(Workload(target="tpu:v5p-8")) == named
  assert resolved_target(get_target("tpu:v5p-8")) == named  # a Target made without its capacity gets it
  held = resolved_target("tpu:v5p-8", resident=1 << 30)
  assert held.capacity_bytes == named.capacity_bytes - (1 << 30) and resolved_target(held, resident=1 << 30) == held
  with pytest.raises(JaxmemError, match="already holds"):
    resolved_target(held, resident=1 << 20)


@pytest.mark.needs_tpu_compiler
def test_arguments_over_a_named_targets_capacity_are_refused_without_a_compile(monkeypatch):
  import jaxmem.compiler.figures as figures

  monkeypatch.setattr(figures, "compile_timed", lambda *a, **k: pytest.fail("compiled"))
  big = jax.ShapeDtypeStruct((1 << 36,), jnp.float32)  # 256 GiB on each of the devices it is replicated on
  with pytest.raises(JaxmemError, match="the arguments alone need"):
    jaxmem.analyze(lambda x: x * 2, big, target="tpu:v5p-8")
  with pytest.raises(JaxmemError, match="cannot fit"):
    jaxmem.explain(lambda x: x * 2, big, target="tpu:v5p-8")
