"""A user's own step told straight: rows cached under what the step traced, policies that cannot
act on it refused or noted, progress before each compile, the cache's bad entries recompiled."""

from __future__ import annotations

import json
import pathlib
import textwrap

import jax
import pytest

import jaxmem
from jaxmem.cli import main
from jaxmem.errors import JaxmemError

ENV = "JAXMEM_TEST_OWNSTEP_WIDTH"
FACTORY = textwrap.dedent(f"""
    import os

    import jax
    import jax.numpy as jnp


    def make_step(*, batch, seq, remat):
      width = int(os.environ.get("{ENV}", "64"))  # the model's size from the environment, as scripts do

      def train_step(params, x_bd):
        def loss(p):
          layer = lambda h: jnp.tanh(h @ p)
          layer = layer if remat is None else jax.checkpoint(layer, policy=remat)
          return layer(layer(x_bd)).sum()

        return params - 1e-3 * jax.grad(loss)(params)

      params = jax.ShapeDtypeStruct((width, width), jnp.float32)
      x = jax.ShapeDtypeStruct((batch * seq, width), jnp.float32)
      return train_step, (params, x), {{"donate_argnums": (0,)}}
""")


@pytest.fixture
def factory(tmp_path: pathlib.Path) -> str:
  path = tmp_path / "envstep.py"
  path.write_text(FACTORY)
  return f"{path}:make_step"


def _rows(step: str, cache: jaxmem.RowCache, remat: str = "none") -> list[jaxmem.Row]:
  return jaxmem.compare(step=step, target="cpu", batch=2, seq=8, remat=remat, cache=cache)


def test_a_factory_sized_by_the_environment_gets_new_rows_when_it_changes(factory, tmp_path, monkeypatch):
  cache = jaxmem.RowCache(tmp_path / "cache")
  monkeypatch.setenv(ENV, "64")
  small = _rows(factory, cache)
  monkeypatch.setenv(ENV, "128")
  large = _rows(factory, cache)
  # Same factory, same source, same workload: the traced program differs, and so do the rows.
  assert not small[0].cached and not large[0].cached
  assert large[0].param_bytes == 4 * small[0].param_bytes
  monkeypatch.setenv(ENV, "64")
  again = _rows(factory, cache)
  assert again[0].cached and again[0].param_bytes == small[0].param_bytes
  assert again[0].as_dict()["cached"] is True


def test_a_cache_entry_of_the_wrong_shape_is_recompiled_with_a_notice(factory, tmp_path):
  cache = jaxmem.RowCache(tmp_path / "cache")
  first = _rows(factory, cache)
  files = list((tmp_path / "cache" / "rows").glob("*.json"))
  assert len(files) == 1
  files[0].write_text(json.dumps({"not": "a row"}))  # valid JSON, not a row
  seen: list = []
  with jaxmem.listen(seen.append):
    again = _rows(factory, cache)
  notices = [e.text for e in seen if isinstance(e, jaxmem.Notice)]
  assert len(notices) == 1 and "does not read back as a row" in notices[0] and str(files[0]) in notices[0]
  assert not again[0].cached and again[0].temp_size_in_bytes == first[0].temp_size_in_bytes
  assert json.loads(files[0].read_text())["remat"] == "none"  # rewritten


def test_a_bad_cache_entry_is_one_line_on_stderr(factory, tmp_path, monkeypatch, capsys):
  monkeypatch.setenv("JAXMEM_CACHE_DIR", str(tmp_path / "cli-cache"))
  argv = ["compare", "--step", factory, "--target", "cpu", "--batch", "2", "--seq", "8", "--remat", "none"]
  assert main(argv) == 0
  for f in (tmp_path / "cli-cache" / "rows").glob("*.json"):
    f.write_text("[1, 2, 3]")
  capsys.readouterr()
  assert main(argv) == 0
  err = capsys.readouterr().err
  assert [line for line in err.splitlines() if "does not read back as a row" in line] == [err.strip().splitlines()[0]]


def test_a_cached_row_says_so_in_the_table(factory, tmp_path, monkeypatch, capsys):
  monkeypatch.setenv("JAXMEM_CACHE_DIR", str(tmp_path / "cli-cache"))
  argv = ["compare", "--step", factory, "--target", "cpu", "--batch", "2", "--seq", "8", "--remat", "none"]
  assert main(argv) == 0
  assert "cached" not in capsys.readouterr().out
  assert main([*argv, "--columns", "compile_seconds"]) == 0
  row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("none "))
  assert row.split()[-1] == "cached"  # in the compile seconds' column


def test_selective_is_refused_for_a_step(factory):
  with pytest.raises(JaxmemError, match="`remat` selective rebuilds jaxmem's own models"):
    jaxmem.compare(step=factory, target="cpu", batch=2, seq=8, remat="selective")


def test_all_leaves_selective_out_for_a_step(factory):
  from jaxmem.resolve import plan

  names = [rp.name for rp in plan(step=factory, target="cpu", batch=2, seq=8, remat="all").remats]
  assert "selective" not in names and "full" in names


def test_a_name_policy_on_a_step_without_names_says_so(factory, tmp_path, monkeypatch, capsys):
  monkeypatch.setenv("JAXMEM_CACHE_DIR", str(tmp_path / "cli-cache"))
  argv = ["compare", "--step", factory, "--target", "cpu", "--batch", "2", "--seq", "8", "--remat", "minimal"]
  assert main(argv) == 0
  out = capsys.readouterr().out
  note = next(line for line in out.splitlines() if "checkpoint names" in line)
  assert "remat minimal" in note and "missing: key_proj" in note and "found: none" in note
  # `full` is not name-based: no such note for it.
  rows = jaxmem.compare(step=factory, target="cpu", batch=2, seq=8, remat="full")
  assert not any("checkpoint names" in n for r in rows for n in r.notes)


def test_the_first_progress_line_comes_before_the_first_compile(factory, tmp_path, monkeypatch, capsys):
  import jaxmem.compiler.figures as figures

  monkeypatch.delenv("JAXMEM_NO_PROGRESS", raising=False)
  monkeypatch.setenv("JAXMEM_CACHE_DIR", str(tmp_path / "cli-cache"))
  seen_before: list[str] = []
  real = figures.compile_timed

  def compile_timed(*args, **kwargs):
    seen_before.append(capsys.readouterr().err)  # what stderr had when this compile started
    return real(*args, **kwargs)

  monkeypatch.setattr(figures, "compile_timed", compile_timed)
  argv = ["compare", "--step", factory, "--target", "cpu", "--batch", "2", "--seq", "8", "--remat", "full"]
  assert main(argv) == 0
  assert len(seen_before) == 2
  assert "jaxmem: compiling 1 of 2: " in seen_before[0] and "remat none" in seen_before[0]
  assert "compiling 2 of 2" in seen_before[1] and "left)" in seen_before[1]  # the estimate, after the first


def test_explain_says_it_compiles_before_the_compile(factory, monkeypatch, capsys):
  import jaxmem.compiler.figures as figures

  monkeypatch.delenv("JAXMEM_NO_PROGRESS", raising=False)
  seen_before: list[str] = []
  real = figures.compile_timed

  def compile_timed(*args, **kwargs):
    seen_before.append(capsys.readouterr().err)  # what stderr had when this compile started
    return real(*args, **kwargs)

  monkeypatch.setattr(figures, "compile_timed", compile_timed)
  assert main(["explain", "--step", factory, "--target", "cpu", "--batch", "2", "--seq", "8"]) == 0
  (before,) = seen_before
  assert "jaxmem: compiling 1 of 1: step:envstep:make_step for cpu: " in before and "batch 2, seq 8" in before
  # The library's listeners hear the same event before the compile, from a function too.
  events: list = []
  monkeypatch.setattr(figures, "compile_timed", lambda *a, **k: (events.append("compile"), real(*a, **k))[1])
  with jaxmem.listen(events.append):
    jaxmem.explain(_grad_step, *_grad_args(), target="cpu")
  assert [type(e).__name__ if e != "compile" else e for e in events] == ["Compiling", "compile"]
  assert events[0].label == "_grad_step for cpu"


def test_explain_says_nothing_of_a_step_time_it_does_not_show(factory):
  r = jaxmem.explain(step=factory, target="cpu", batch=2, seq=8)
  assert r.notes and not any(n.startswith(("mfu:", "step time:", "step_time_s:")) for n in r.notes)
  assert not any(n.startswith(("mfu:", "step time:")) for n in jaxmem.explain(_grad_step, *_grad_args(), target="cpu").notes)


def test_fit_says_how_many_compiles_its_search_expects():
  from jaxmem.planning.fit import expected_compiles_line

  affine, bisect = expected_compiles_line(3, "affine", False), expected_compiles_line(3, "bisect", False)
  assert "searching 3 configurations" in affine
  count = lambda line: int(line.split("expect about ")[1].split()[0])  # noqa: E731
  assert count(affine) < count(bisect) and count(expected_compiles_line(3, "affine", True)) > count(affine)


@pytest.mark.parametrize("flag, path", [("--xprof", "/proc/nope/x"), ("--plot", "/proc/nope.png"), ("--output", "/proc/out.txt")])
def test_an_unwritable_path_is_one_line_before_any_compile(flag, path, monkeypatch, capsys):
  import jaxmem.compiler.figures as figures

  def compile_timed(*args, **kwargs):
    raise AssertionError("compiled before the path was checked")

  monkeypatch.setattr(figures, "compile_timed", compile_timed)
  command = "compare" if flag == "--output" else "explain"
  rc = main([command, "--model", "tiny", "--target", "cpu", "--batch", "2", "--seq", "16", flag, path])
  err = capsys.readouterr().err.strip()
  assert rc == 2 and len(err.splitlines()) == 1 and err.startswith(f"jaxmem: error: cannot write {flag} {path}"), err


def _capped(capacity: int) -> jaxmem.Target:
  import dataclasses

  return dataclasses.replace(jaxmem.target("cpu"), capacity_bytes=capacity, capacity_note=None)


def _grad_step(w, x):
  import jax
  import jax.numpy as jnp

  return jax.grad(lambda w: jnp.tanh(x @ w).sum())(w)


def _grad_args():
  import jax.numpy as jnp

  return jax.ShapeDtypeStruct((256, 256), jnp.float32), jax.ShapeDtypeStruct((512, 256), jnp.float32)


def test_analyze_and_explain_judge_against_the_capacity():
  import jax
  import jax.numpy as jnp

  w = jax.ShapeDtypeStruct((256, 256), jnp.float32)
  x = jax.ShapeDtypeStruct((512, 256), jnp.float32)
  free = jaxmem.analyze(_grad_step, w, x, target="cpu")
  assert free.capacity_bytes is None and free.fits is None  # the CPU has no capacity: no verdict
  arguments = free.argument_size_in_bytes
  tight = jaxmem.analyze(_grad_step, w, x, target=_capped(arguments + 1))  # the arguments fit, the step does not
  assert tight.capacity_bytes == arguments + 1 and tight.fits is False and tight.verdict == "NO"
  assert tight.margin_bytes == tight.capacity_bytes - tight.required_bytes < 0
  assert any(n.startswith("fits: NO") for n in tight.notes)
  roomy = jaxmem.analyze(_grad_step, w, x, target=_capped(1 << 34))
  assert roomy.fits is True and roomy.verdict in ("yes", "at risk")
  r = jaxmem.explain(_grad_step, w, x, target=_capped(arguments + 1))
  assert (r.capacity_bytes, r.required_bytes, r.fits, r.verdict) == (
      tight.capacity_bytes, tight.required_bytes, False, "NO")
  from jaxmem.render.explain import explain_json, render_explain

  assert explain_json(r)["verdict"] == "NO"
  assert "fits NO" in render_explain(r, "table")


D = 256


def make_f32_step(*, batch, seq, remat, clip=True):
  """Four float32 layers and SGD, with the gradients clipped by their global norm (so all of
  them are made before the first update) unless ``clip`` is False: float32 gradients, the
  parameters' own dtype."""
  import jax
  import jax.numpy as jnp

  def train_step(params, x_bd):
    def loss(p):
      h = x_bd
      for w in p:
        h = jnp.tanh(h @ w)
      return (h**2).mean()

    grads = jax.grad(loss)(params)
    scale = 1e-3 / jnp.sqrt(sum((g**2).sum() for g in grads)) if clip else 1e-3
    return [w - scale * g for w, g in zip(params, grads, strict=True)]

  params = [jax.ShapeDtypeStruct((D, D), jnp.float32) for _ in range(4)]
  return train_step, (params, jax.ShapeDtypeStruct((batch * seq, D), jnp.float32)), {"donate_argnums": (0,)}


def make_unclipped_step(*, batch, seq, remat):
  return make_f32_step(batch=batch, seq=seq, remat=remat, clip=False)


def test_the_gradient_consumer_of_a_step_is_its_parameters_bytes():
  r = jaxmem.explain(step=make_f32_step, target="cpu", batch=2, seq=48, remat="none")  # 96 rows: no activation shaped as a weight
  params = r.arguments["params"]
  assert abs(r.consumers["gradient"] - params) <= 0.05 * params, (r.consumers, r.notes)
  assert sum(r.consumers.values()) == r.footprint_bytes
  assert not any(n.startswith("gradient:") for n in r.notes)


def test_a_gradient_consumer_off_the_parameters_bytes_says_why():
  # Unclipped SGD: XLA updates each layer as its gradient is made, so they are never all live.
  r = jaxmem.explain(step=make_unclipped_step, target="cpu", batch=2, seq=48, remat="none")  # 96 rows: no activation shaped as a weight
  params = r.arguments["params"]
  if abs(r.consumers["gradient"] - params) > 0.05 * params:
    assert any(n.startswith("gradient:") and "never holds them all at once" in n for n in r.notes), r.notes


ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def nnx_explained():
  return jaxmem.explain(step=f"{ROOT / 'examples' / 'nnx_step.py'}:make_tiny_step", target="cpu", batch=2, seq=64,
                        remat="none", top=10)


def test_the_gradient_consumer_of_an_nnx_step_is_in_its_gradient_dtype(nnx_explained):
  r = nnx_explained
  # The NNX layers compute in bfloat16. jax 0.12's CPU compiler makes the gradients in bfloat16
  # (half the float32 parameters' bytes) and converts them inside the optimizer's update, and the
  # notes say so; jax 0.10.2's makes them in float32 (no such note), the parameters' own bytes.
  in_bf16 = any("gradients in bf16" in n for n in r.notes)
  assert in_bf16 or tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 11), r.notes
  expected = r.arguments["params"] // 2 if in_bf16 else r.arguments["params"]
  # Within 5% of that, or a note that says why not: how many copies the compiler keeps live at
  # once is its release's choice (jax 0.10.2's holds 1.2 copies of this step's).
  within = abs(r.consumers["gradient"] - expected) <= 0.05 * expected
  assert within or any(n.startswith("gradient: ") and "of params' gradients" in n for n in r.notes), (r.consumers, r.notes)
  assert r.consumers["gradient"] >= 0.95 * expected  # never less than one copy


def test_an_nnx_steps_buffers_name_the_models_lines_not_flax(nnx_explained):
  made = [b for b in nnx_explained.peak_buffers if b.kind != "parameter"]
  assert made
  for b in made:
    assert b.source is not None and b.source.startswith("examples/nnx_step.py:"), b
    assert "flax" not in b.source and "jax/" not in b.source
  # The framework's own line each called is kept apart.
  assert any(b.framework and ("optax" in b.framework or "flax" in b.framework or "jax" in b.framework) for b in made)


def test_extra_framework_packages_move_the_source_past_them(nnx_explained, monkeypatch):
  # Taking the examples' directory as a framework's, the source moves out of it.
  from jaxmem.buffers import sources

  real = sources._package_roots
  monkeypatch.setattr(sources, "_package_roots", lambda package: (str(ROOT / "examples") + "/",)
                      if package == "myframework" else real(package))
  r = jaxmem.explain(step=f"{ROOT / 'examples' / 'nnx_step.py'}:make_tiny_step", target="cpu", batch=2, seq=64,
                     remat="none", top=10, framework_packages="myframework")
  made = [b for b in r.peak_buffers if b.kind != "parameter"]
  assert all(not (b.source or "").startswith("examples/") for b in made), made
  assert any((b.framework or "").startswith("examples/nnx_step.py:") for b in made), made
  with pytest.raises(JaxmemError, match="not a Python package name"):
    jaxmem.explain(step=make_f32_step, target="cpu", batch=2, seq=8, framework_packages="not a name")


@pytest.mark.needs_tpu_compiler
def test_a_one_chip_v5p_equals_a_raw_one_chip_compile():
  import jax
  import jax.numpy as jnp
  from jax.experimental import topologies
  from jax.sharding import NamedSharding, PartitionSpec

  t = jaxmem.target("tpu:v5p-2")
  assert t.num_devices == 1 and t.device_kind == "TPU v5"
  w = jax.ShapeDtypeStruct((512, 512), jnp.float32)
  x = jax.ShapeDtypeStruct((1024, 512), jnp.bfloat16)
  ours = jaxmem.analyze(_grad_step, w, x, target="tpu:v5p-2")
  # jax's own AOT compile for the same topology: one v5p chip, a host of one chip.
  topo = topologies.get_topology_desc(platform="tpu", topology_name="v5p:1x1x1", chips_per_host_bounds=(1, 1, 1))
  (device,) = topo.devices
  on = NamedSharding(jax.sharding.Mesh([device], ("d",)), PartitionSpec())
  placed = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=on) for a in (w, x)]
  raw = jax.jit(_grad_step, out_shardings=on).lower(*placed).compile().memory_analysis()
  for field in ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
                "peak_memory_in_bytes"):
    assert getattr(ours, field) == getattr(raw, field), field
