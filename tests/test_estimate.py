"""jaxmem.planning.estimate: the closed forms, the seeds' figures from the presets, and the compiler side by side."""

from __future__ import annotations

import pytest

from jaxmem.planning import estimate as est
from jaxmem.errors import JaxmemError
from jaxmem.models import count_params, get_config


def test_mixed_precision_adam_is_16_bytes_per_param():
  # ZeRO sec. 3.1: 2 (fp16 params) + 2 (fp16 grads) + 12 (fp32 master, m, v).
  assert est.bytes_per_param("adamw", "mixed") == (2, 2, 12)
  e = est.estimate(model="gpt2-small", optimizer="adamw", precision="mixed")
  assert e.bytes_per_param == 16
  assert e.model_state_bytes == 16 * count_params(get_config("gpt2-small"))
  assert e.model_state_bytes == e.param_bytes + e.gradient_bytes + e.optimizer_state_bytes
  assert est.bytes_per_param("sgd", "fp32") == (4, 4, 0)
  assert est.bytes_per_param("adamw", "fp32") == (4, 4, 8)


def test_seed_figures_from_the_presets():
  s = est.seed_figures("llama3-405b")
  assert s["weight_bytes_bf16"] / 1e9 == pytest.approx(810, rel=0.01)
  assert s["weight_bytes_fp8"] / 1e9 == pytest.approx(405, rel=0.01)
  assert s["weight_bytes_int4"] / 1e9 == pytest.approx(203, rel=0.01)
  assert s["model_state_bytes"] / 1e12 == pytest.approx(6.48, rel=0.01)
  assert s["h100_80gb_equivalents"] == pytest.approx(81, abs=1)
  assert est.seed_figures("llama3-70b")["weight_bytes_bf16"] / 1e9 == pytest.approx(140, rel=0.01)


def test_kv_cache_formula():
  cfg = get_config("llama3-8b")
  # 2 * 32 layers * 8 kv heads * 128 * 131072 * 1 * 2 bytes = 16 GiB.
  assert est.kv_cache_bytes(cfg, context=131072, batch=1) == 16 * 2**30


def test_activation_formulas_korthikanti_table2():
  cfg = get_config("gpt2-small")
  s, b, h, a = 1024, 8, cfg.d_model, cfg.num_heads
  sbh = s * b * h
  assert est.activation_bytes_per_layer(cfg, batch=b, seq=s) == pytest.approx(sbh * (34 + 5 * a * s / h))
  assert est.activation_bytes_per_layer(cfg, batch=b, seq=s, tensor=4) == pytest.approx(sbh * (10 + 24 / 4 + 5 * a * s / (h * 4)))
  assert est.activation_bytes_per_layer(cfg, batch=b, seq=s, tensor=4, sequence_parallel=True) == pytest.approx(sbh / 4 * (34 + 5 * a * s / h))
  assert est.activation_bytes_per_layer(cfg, batch=b, seq=s, tensor=4, sequence_parallel=True, recompute="selective") == pytest.approx(34 * sbh / 4)
  assert est.activation_bytes_per_layer(cfg, batch=b, seq=s, recompute="full") == 2 * sbh
  with pytest.raises(JaxmemError):
    est.activation_bytes_per_layer(cfg, batch=b, seq=s, recompute="some")


def test_estimate_vs_compiler_has_ratios_and_notes():
  from jaxmem.planning import sweep

  (row,) = [r for r in sweep.compare(model="tiny", remat="none", batch=2, seq=32, target="cpu") if r.remat == "none"]
  comps = {c.component: c for c in est.estimate_vs_compiler(row)}
  assert set(comps) == {"params", "gradients", "optimizer state", "argument", "temp", "total"}
  # jaxmem's step keeps fp32 params and Adam moments: the closed form is exact for those.
  assert comps["params"].ratio == pytest.approx(1.0)
  assert comps["optimizer state"].ratio == pytest.approx(1.0, rel=0.01)
  # The compiler's gradients are inside its temp, with the activations: no figure of their own.
  assert comps.pop("gradients").compiler_bytes is None
  for c in comps.values():
    assert c.ratio is not None and c.source
    assert (c.note != "") == (abs(c.ratio - 1) > 0.2)
