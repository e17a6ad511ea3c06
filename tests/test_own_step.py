"""A user's own step told straight: rows cached under what the step traced, policies that cannot
act on it refused or noted, progress before each compile, the cache's bad entries recompiled."""

from __future__ import annotations

import json
import pathlib
import textwrap

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
  assert main(argv) == 0
  row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("none "))
  assert row.split()[-1] == "cached"  # in the compile seconds' column


def test_selective_is_refused_for_a_step(factory):
  with pytest.raises(JaxmemError, match="`remat` selective rebuilds jaxmem's own models"):
    jaxmem.compare(step=factory, target="cpu", batch=2, seq=8, remat="selective")


def test_all_leaves_selective_out_for_a_step(factory):
  from jaxmem.planning.plan import plan

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


def test_fit_says_how_many_compiles_its_search_expects():
  from jaxmem.planning.fit import expected_compiles_line

  affine, bisect = expected_compiles_line(3, "affine", False), expected_compiles_line(3, "bisect", False)
  assert "searching 3 configurations" in affine
  count = lambda line: int(line.split("expect about ")[1].split()[0])  # noqa: E731
  assert count(affine) < count(bisect) and count(expected_compiles_line(3, "affine", True)) > count(affine)
