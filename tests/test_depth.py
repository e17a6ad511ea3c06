"""The two-depth prediction: a scanned stack's memory at full depth from compiles at 2 and 4 layers."""

import dataclasses

import pytest

from jaxmem.models import get_config
from jaxmem.planning import depth, sweep
from jaxmem.resolve import plan

# Three architectures, each with a full stack twice the deeper probe: a Llama-style dense model,
# GPT-2 (learned positions, LayerNorm, GELU MLP) and DeepSeek-style MLA with a dense first layer
# before the experts (only the expert stack's depth varies).
MODELS = {
    "tiny": get_config("tiny", num_layers=8),
    "tiny-gpt2": get_config("tiny-gpt2", num_layers=8),
    "tiny-mla": get_config("tiny-mla", num_layers=9),
}


def _required(cfg, target, layers=None, batch=2, seq=64):
  p = plan(model=cfg, remat="full", optimizer="adamw", batch=batch, seq=seq, target=target)
  p = p if layers is None else depth.depth_plan(p, layers)
  mesh, opt, rp = p.configs()[-1]
  return sweep.run_config(p, mesh, opt, rp)


def _check(name, target, rel=0.02, **workload):
  cfg = MODELS[name]
  a, b = depth.probe_depths(cfg)
  assert b - a == 2 and (a, b) == ((3, 5) if cfg.is_moe and cfg.first_dense_layers else (2, 4))
  ra, rb, full = (_required(cfg, target, layers, **workload) for layers in (a, b, None))
  assert ra.required_bytes < rb.required_bytes < full.required_bytes  # the depth matters
  predicted = depth.predict((ra, rb), (a, b), cfg.num_layers, capacity=full.required_bytes * 2)
  assert predicted.fits
  assert predicted.required == pytest.approx(full.required_bytes, rel=rel), (name, predicted.required, full.required_bytes)
  # The extrapolation is not a restatement of the deeper probe: the full depth needs more.
  assert full.required_bytes - rb.required_bytes > 0.02 * full.required_bytes


# MLA's three CPU compiles are the suite's heaviest of the three (about 23 s on 2 cores): slow,
# with its TPU twin; the dense stacks stay in the fast suite.
@pytest.mark.parametrize("name", [n if n not in ("tiny-mla", "tiny-gpt2") else pytest.param(n, marks=pytest.mark.slow) for n in MODELS])
def test_two_depths_predict_the_full_depth_within_2_percent(name):
  # The host CPU's compiler (fast): its required bytes are argument + output + temp.
  _check(name, "cpu")


@pytest.mark.slow
@pytest.mark.needs_tpu_compiler
@pytest.mark.parametrize("name", list(MODELS))
def test_two_depths_predict_the_full_depth_within_5_percent_on_tpu(name):
  # The TPU compiler's peak (its own heap simulation), the figure fit searches on, which is not
  # exactly affine in depth: its layout and scheduling choices differ between a 2-layer and an
  # 8-layer scan. Measured (libtpu 0.0.50.1): at batch 2 and sequence 64, where the peak is a few
  # MB of small buffers, tiny's steps per two layers were 2.3, 1.8 and 1.2 MB and the line
  # over-predicted by 12-25%; at batch 16 and sequence 256 (GPT-2's learned positions stop at 256)
  # the activations dominate, the dense models land within 2% and tiny-mla's expert stack 2.8%
  # under (its step from 3 to 5 layers is 5.7 MB, the later ones 6.8). fit compiles its answer and
  # the answer's neighbour at full depth and reports the line's error (``depth_error_pct``), so the
  # line only has to start that confirmation near the boundary.
  _check(name, "tpu:v5e-1", rel=0.05, batch=16, seq=256)



def test_probing_needs_a_stack_deeper_than_the_probes():
  assert depth.probe_depths(get_config("tiny")) is None  # 2 layers
  assert depth.probe_depths(get_config("tiny", num_layers=5)) == (2, 4)
  assert depth.probe_depths(None) is None  # a user's step
  shallow = dataclasses.replace(MODELS["tiny-mla"], num_layers=5)  # 1 dense + 4 expert layers
  assert depth.probe_depths(shallow) is None
