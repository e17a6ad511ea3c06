"""explain of a configuration the compiler refuses: its buffers extrapolated from compiles that fit
(fewer layers; a smaller batch where the depth alone does not fit), their sum against the
requirement the compiler states, and the changes that fit (a tiny model at 8 layers on a TPU
whose capacity resident bytes cap; the module compiles one refusal, its two probes and one change)."""

import json
import types

import pytest

import jaxmem
from jaxmem import JaxmemError
from jaxmem.buffers.analyse import BufferGroup
from jaxmem.cli import main
from jaxmem.planning.depth import at_depth
from jaxmem.planning.refusal import EXTRAPOLATED, RefusalExplanation, bilinear, extrapolate_groups
from jaxmem.render.explain import render_refusal

MiB = 1 << 20
TINY8 = at_depth(jaxmem.load_model("tiny"), 8)
# The v5e's capacity less what another program holds: 600 MiB left for the step, where 4 layers
# of tiny at this batch fit and 8 do not (the probes are the two depths at the batch asked).
FIELDS = dict(model=TINY8, target="tpu:v5e-1", batch=64, seq=256, remat="none")


def _resident(capacity: int) -> int:
  return jaxmem.target("tpu:v5e-1").capacity_bytes - capacity


@pytest.fixture(scope="module")
def refused():
  return jaxmem.explain(**FIELDS, resident=_resident(600 * MiB), changes=1)


@pytest.mark.needs_tpu_compiler
def test_the_buffers_sum_to_the_requirement_the_compiler_states(refused):
  r = refused
  assert isinstance(r, RefusalExplanation) and r.fits is False and r.verdict == "NO"
  assert r.required_bytes > r.capacity_bytes  # the refusal's own figures
  assert r.extrapolated_bytes == sum(b.size_bytes for b in r.buffers)
  assert abs(r.extrapolated_bytes - r.required_bytes) <= 0.05 * r.required_bytes, (r.error_pct, r.probes)
  # The refusal is in the compiler's words, not the line a refusal nobody explains ends with.
  assert "no plan to explain" not in r.error and str(r.required_bytes) not in r.error.replace(",", "")


@pytest.mark.needs_tpu_compiler
def test_every_buffer_is_extrapolated_from_smaller_compiles_that_fit(refused):
  r = refused
  assert r.buffers and all(b.how == EXTRAPOLATED and b.size_bytes > 0 for b in r.buffers)
  fitting = [p for p in r.probes if p.fits]
  assert len(fitting) in (2, 4) and all(p.layers < TINY8.num_layers and p.batch <= r.batch for p in fitting)
  assert all(len(b.probe_bytes) == len(fitting) for b in r.buffers)
  # A stacked residual's shape is read off its line: its leading dimension is the model's depth.
  stacked = [b for b in r.buffers if b.kind == "saved residual" and b.shape]
  assert any(b.shape.startswith(f"[{TINY8.num_layers},") for b in stacked), [b.shape for b in stacked]


@pytest.mark.needs_tpu_compiler
def test_the_changes_listed_fit_when_compiled_and_come_first(refused):
  changes = refused.changes
  assert changes and all(c.how == "compiled" for c in changes)
  assert any(c.fits for c in changes)
  fits = [bool(c.fits) for c in changes]
  assert fits == sorted(fits, reverse=True)  # those that fit first
  for c in changes:
    if c.fits:
      assert c.required_bytes <= c.capacity_bytes
    if c.extrapolated_bytes is not None and "batch" in c.fields:  # the line chose it; the compile agrees
      assert abs(c.extrapolated_bytes - c.required_bytes) <= 0.1 * c.required_bytes


@pytest.mark.needs_tpu_compiler
def test_json_and_table_carry_the_extrapolated_buffers_and_the_requirement(refused):
  doc = json.loads(render_refusal(refused, "json"))
  assert doc["required_bytes"] == refused.required_bytes and doc["fits"] is False
  assert doc["extrapolated_bytes"] == sum(b["size_bytes"] for b in doc["buffers"])
  assert {b["how"] for b in doc["buffers"]} == {EXTRAPOLATED}
  assert doc["model"] == "tiny" and doc["batch"] == FIELDS["batch"]
  table = render_refusal(refused, "table")
  assert "the requirement the refusal states" in table and "refused by the compiler" in table


@pytest.mark.needs_tpu_compiler
def test_a_refusal_saved_as_json_says_what_made_it_and_diff_refuses_it_in_one_line(refused, tmp_path, capsys):
  doc = json.loads(render_refusal(refused, "json"))
  from jaxmem.inputs import REFUSAL

  assert doc["made_by"]["command"] == "explain" and doc["made_by"]["kind"] == REFUSAL
  saved = tmp_path / "refused.json"
  saved.write_text(render_refusal(refused, "json"))
  assert main(["diff", str(saved), str(saved)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "refused" in err[0]


@pytest.mark.needs_tpu_compiler
def test_a_step_that_fits_at_no_smaller_compile_is_one_line(capsys):
  # Under the arguments alone even at the probe depths: judged from shapes, nothing compiles.
  argv = ["explain", "--model", "gpt2-small", "--target", "tpu:v5e-1", "--batch", "2", "--seq", "64",
          "--resident", str(_resident(MiB))]
  assert main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len([ln for ln in err if ln.startswith("jaxmem: error:")]) == 1
  assert "no smaller compile to explain it from" in err[-1]


def _group(kind, size, shape="", source="m.py:1"):
  return BufferGroup(kind=kind, dtype="bf16", shape=shape, source=source, op="mul", module="M", count=1, size_bytes=size)


def test_bilinear_groups_recover_an_affine_law_in_depth_and_batch():
  # A stacked residual (layers x batch), a logits buffer (batch) and the parameters (layers): each
  # group's bytes and shape at (16, 32) from the four corners, exactly.
  def live(layers, batch):
    return types.SimpleNamespace(live_set=(
        _group("saved residual", 2 * layers * batch * 64, f"[{layers},{batch},64]"),
        _group("temporary", 4 * batch * 100, f"[{batch},100]", source="m.py:2"),
        _group("parameter", 1000 * layers + 10, source="m.py:3"),
    ))
  corners = {(l, b): live(l, b) for l in (2, 4) for b in (4, 8)}
  got = {b.kind: b for b in extrapolate_groups(corners, (2, 4), (4, 8), (16, 32))}
  want = live(16, 32).live_set
  assert {k: b.size_bytes for k, b in got.items()} == {g.kind: g.size_bytes for g in want}
  assert got["saved residual"].shape == "[16,32,64]" and got["temporary"].shape == "[32,100]"
  assert bilinear({(2, 8): 5, (4, 8): 9}, (2, 4), (8,), (16, 8)) == 33


def test_probes_halve_the_batch_until_the_deeper_depth_fits_then_take_half_of_it():
  # A step that fits under 100 units, needing layers x batch: at batch 64, 2 layers do not fit;
  # 4 layers first fit at batch 16, so the corners are 2 and 4 layers at batches 8 and 16.
  def compile_at(layers, batch):
    need = layers * batch
    return types.SimpleNamespace(live_set=()) if need < 100 else _refusal(need)

  fitting = (types.SimpleNamespace,)
  corners, batches, tried = _probe_compiles(compile_at, fitting, batch=64)
  assert batches == (8, 16) and set(corners) == {(2, 16), (4, 16), (2, 8), (4, 8)}
  assert [k for k, _ in tried] == [(2, 64), (4, 32), (4, 16), (2, 16), (2, 8), (4, 8)]
  # Where the deeper depth fits at no batch the mesh takes: nothing to extrapolate from.
  corners, batches, _ = _probe_compiles(lambda l, b: _refusal(l * b * 100), fitting, batch=64)
  assert corners is None and batches == (1,)


def _refusal(need):
  from jaxmem.errors import CompilerRefused

  return CompilerRefused("refused", required_bytes=need, capacity_bytes=100, out_of_memory=True, compiled=True)


def _probe_compiles(compile_at, fitting, *, batch):
  from jaxmem.planning import refusal

  return refusal.probe_compiles(compile_at, (2, 4), batch, valid=lambda b: b >= 1, fitting=fitting)
