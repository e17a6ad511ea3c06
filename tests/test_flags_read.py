"""Every flag a command accepts changes what it does on every path of that command, or is refused
there in one line: generated from the parser, so a new flag is covered as it is added.

The flags come from ``build_parser()`` (each subcommand's actions); the paths are the commands'
code's, listed in :data:`PATHS` (a path is a branch of a command's ``run``, or a kind of step
its library call plans differently: the argv that takes it). For each (command, path, flag) the
command runs without compiling (tests/clistub.py: the sentinel where a compile would start,
then the command goes on with stand-in results) with the flag at a value other than its default
and the path's, and without it: the flag is read when the two runs did something different (a
library or renderer call with other arguments, other output, another file), refused when the
run with it is one line on stderr, exit 2, naming the flag. Neither fails, naming the command,
path and flag. No compile runs: the whole module takes seconds.
"""

from __future__ import annotations

import argparse
import json
import textwrap

import pytest

from clistub import no_compiles, run, stop
from jaxmem import AXES, inputs
from jaxmem.cli import build_parser
from jaxmem.registry import published

TARGET = "tpu:v5e-8"
TINY = ["--model", "tiny", "--target", TARGET]
STEP = "{step}"  # the test's step factory (make_step in a file of the test's folder)
# MaxText's config: where MaxText is not installed its path's runs are refused, and skipped.
MAXTEXT = ["--maxtext", "base.yml", "per_device_batch_size=1"]

# Each command's paths, as its code branches: path -> the argv (after the command) that takes it.
PATHS: dict[str, dict[str, list[str]]] = {
    "compare": {
        "sweep": TINY,
        "sweep as json": [*TINY, "--format", "json"],
        "residuals": [*TINY, "--residuals"],
        "own step": ["--step", STEP, "--target", TARGET],
        "maxtext": [*MAXTEXT, "--target", TARGET],
    },
    "explain": {
        "model": TINY,
        "model as json": [*TINY, "--format", "json"],
        "own step": ["--step", STEP, "--target", TARGET],
        "maxtext": [*MAXTEXT, "--target", TARGET],
    },
    "fit": {
        "batch search": TINY,
        "ranked at a fixed workload": [*TINY, "--batch", "32", "--seq", "64"],
        "remat search": [*TINY, "--batch", "32", "--seq", "64", "--remat", "search"],
        "serving decode": [*TINY, "--phase", "decode"],
        "serving prefill": [*TINY, "--phase", "prefill"],
        "serving engine": [*TINY, "--phase", "decode", "--engine", "vllm"],
        "own step": ["--step", STEP, "--target", TARGET],
        "maxtext": [*MAXTEXT, "--target", TARGET],
    },
    "infer": {
        "prefill and decode": TINY,
        "decode": [*TINY, "--phase", "decode"],
        "prefill": [*TINY, "--phase", "prefill"],
        "as json": [*TINY, "--format", "json"],
        "engine vllm": [*TINY, "--engine", "vllm"],
        "engine jetstream": [*TINY, "--engine", "jetstream"],
    },
    "plan": {
        "model": TINY,
        "emit": [*TINY, "--emit", "maxtext"],
        "emit as json": [*TINY, "--emit", "maxtext", "--format", "json"],
        "maxtext": [*MAXTEXT, "--target", TARGET],
    },
    "scale": {
        "model": [*TINY, "--over", "seq=64,128"],
        "model as json": [*TINY, "--over", "seq=64,128", "--format", "json"],
        "own step": ["--step", STEP, "--target", TARGET, "--over", "seq=64,128"],
        "maxtext": [*MAXTEXT, "--target", TARGET, "--over", "seq=64,128"],
    },
    "estimate": {  # large enough a model for its table's figures to move
        "closed form": ["--model", "gpt2-small"],
        "as json": ["--model", "gpt2-small", "--format", "json"],
    },
    "validate": {"attached": ["--model", "tiny"]},
    "_measure": {"one configuration": ["--model", "tiny", "--remat", "full", "--optimizer", "adamw"]},
    "diff": {"rows": ["a.json", "b.json"], "rows as json": ["a.json", "b.json", "--format", "json"]},
    "models": {"list": []},
    "targets": {"list": []},
}

# Values for the flags whose declaration says too little to make one (its type, choices or axis
# do the rest): tried in order, the first that is neither the flag's default nor the path's. By
# the flag's destination, or (command, destination) where commands read it differently.
EXAMPLES: dict[str | tuple[str, str], tuple] = {
    "model": ("tiny-moe", "tiny"),
    ("estimate", "model"): ("tiny-moe",),
    ("diff", "top"): ("1",),
    "target": ("gpu:h100x8", TARGET),  # another platform: one layer's listing (residuals) changes with it
    "batch": ("16", "32"),
    "seq": ("128", "32"),
    "prompt": ("32", "64"),
    ("estimate", "context"): ("512",),
    "context": ("128", "64"),
    "resident": ("1GiB",),
    "mesh": ("data=2,fsdp=4",),
    "format": ("json", "table"),
    "columns": ("all", "memory"),
    # A whole jax stack is refused before anything is fetched: no wheel is downloaded by the suite.
    "compiler": ("jax==0.1",),
    # --emit names a writer of the registry: another command's is refused in one line naming it.
    "emit": ("vllm", "maxtext"),
    "output": ("out.txt",),
    "plot": ("plot.png",),
    "xprof": ("xprof",),
    "scheduler": ("tcp://127.0.0.1:1",),
    "step": (STEP,),
    "maxtext": (tuple(MAXTEXT[1:]),),
    "remat": ("full", "none"),
    "optimizer": ("sgd", "adamw"),
    "weights": ("int8", "bf16"),
    "phase": ("decode", "prefill"),
    ("fit", "over"): ("seq", "batch"),
    ("scale", "over"): ("batch=8,16", "seq=32,64"),
    "kind": ("parameter",),
    "framework_packages": ("numpy",),
    "precision": ("bf16",),
    "recompute": ("full",),
    "capacity_factor": ("2",),
    "dropout": ("0.1",),
    "param_dtype": ("bfloat16",),
    "dtype": ("float32",),
    "master_dtype": ("float32",),
    "moments_dtype": ("bfloat16",),
    "grad_reduce_dtype": ("bfloat16",),
    "quantization": ("fp8_full",),
    "qk_dtype": ("float32",),
    "microbatches": ("2",),
    "vocab_tiles": ("2",),
    "pipeline_microbatches": ("2",),
    "pipeline_repeats": ("2",),
}

FACTORY = textwrap.dedent("""
    import jax
    import jax.numpy as jnp


    def make_step(*, batch, seq, remat):
      def train_step(params, x):
        def loss(p):
          layer = lambda h: jnp.tanh(h @ p)
          layer = layer if remat is None else jax.checkpoint(layer, policy=remat)
          return layer(layer(x)).sum()
        return params - 1e-3 * jax.grad(loss)(params)
      return train_step, (jax.ShapeDtypeStruct((64, 64), jnp.float32),
                          jax.ShapeDtypeStruct((batch * seq, 64), jnp.float32)), {}
""")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
  parser = build_parser()
  (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
  return dict(sub.choices)


def _flags(p: argparse.ArgumentParser) -> list[argparse.Action]:
  """A subcommand's options (not its positional arguments, not --help), as argparse declares them."""
  return [a for a in p._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def _cases() -> list:
  subs = _subparsers()
  assert set(PATHS) == set(subs), f"PATHS lists {sorted(PATHS)}, the parser has {sorted(subs)}: list every command's paths"
  cases = []
  for command, paths in PATHS.items():
    for path, argv in paths.items():
      for action in _flags(subs[command]):
        flag = max(action.option_strings, key=len)
        if example(command, action, argv) is not None:  # None: the flag takes this path (its own switch)
          cases.append(pytest.param(command, path, action.dest, id=f"{command}/{path}/{flag}"))
  return cases


def example(command: str, action: argparse.Action, path_argv: list[str]) -> list[str] | None:
  """The flag at a value other than its default and the path's own, as argv; None where the
  path is taken by the flag at its one value (a switch, the step)."""
  flag = max(action.option_strings, key=len)
  if action.nargs == 0 or (action.nargs == "?" and action.const is not None):
    return None if flag in path_argv else [flag]  # a switch
  candidates = EXAMPLES.get((command, action.dest), EXAMPLES.get(action.dest))
  if candidates is None and action.choices:
    candidates = tuple(action.choices)
  if candidates is None and action.dest in AXES and AXES[action.dest].valid:
    candidates = published(AXES[action.dest].valid)
  if candidates is None and isinstance(action.type, inputs.Choice):
    candidates = action.type.values
  if candidates is None and (action.type is int or isinstance(action.type, inputs.Whole)):
    candidates = ("2", "4", "16")
  if candidates is None and isinstance(action.type, inputs.Fraction):
    candidates = ("0.5", "0.25")
  if candidates is None and (action.type is float or isinstance(action.type, inputs.Number)):
    candidates = ("0.5", "2")
  assert candidates is not None, f"{command} {flag}: no example value; add one to EXAMPLES in {__file__}"
  given = path_argv[path_argv.index(flag) + 1] if flag in path_argv else None
  default = action.default
  for c in candidates:
    if c != given and str(c) != str(default) and (not isinstance(default, (list, tuple)) or c not in default):
      return [flag, *c] if isinstance(c, tuple) else [flag, c]
  assert given is not None, f"{command} {flag}: every example value is its default; add another to EXAMPLES"
  return None


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  """The step factory and two saved results for ``diff``."""
  d = tmp_path_factory.mktemp("flags")
  (d / "step.py").write_text(FACTORY)
  row = dict(model="tiny", target="cpu", mesh="fsdp=1", batch=2, num_devices=1, remat="none", optimizer="adamw",
             seq=64, param_dtype="float32", dtype="bfloat16", temp_size_in_bytes=100, total_bytes=300,
             required_bytes=300, fits=None)
  rows = [{**row, "remat": remat} for remat in ("none", "dots_saveable", "full")]
  grown = [{**r, "total_bytes": 300 + 100 * i, "required_bytes": 300 + 100 * i} for i, r in enumerate(rows)]
  (d / "a.json").write_text(json.dumps({"rows": rows}))
  (d / "b.json").write_text(json.dumps({"rows": grown}))
  return d


@pytest.fixture(scope="module")
def stubbed(tmp_path_factory):
  from jaxmem.planning import search

  with no_compiles(str(tmp_path_factory.mktemp("cache"))), pytest.MonkeyPatch.context() as mp:
    # plan's search sizes each candidate's arguments (a program built per mesh) before its first
    # compile: what plan was asked is its library call, made before.
    mp.setattr(search, "candidates", stop)
    yield


_BASELINES: dict[tuple[str, str], object] = {}


def _argv(command: str, args: list[str], folder) -> list[str]:
  return [command, *(a.replace(STEP, f"{folder / 'step.py'}:make_step") for a in args)]


def _in(folder, tmp_path, name):
  """Each run in a folder of its own, holding the diff inputs (what it writes is compared)."""
  d = tmp_path / name
  d.mkdir()
  for f in ("a.json", "b.json"):
    (d / f).write_text((folder / f).read_text())
  return d


@pytest.mark.parametrize(("command", "path", "dest"), _cases())
def test_every_flag_is_read_or_refused_on_every_path(command, path, dest, folder, stubbed, tmp_path):
  path_argv = PATHS[command][path]
  (action,) = [a for a in _flags(_subparsers()[command]) if a.dest == dest]
  flag = max(action.option_strings, key=len)
  base = _BASELINES.get((command, path))
  if base is None:
    base = _BASELINES[(command, path)] = run(_argv(command, path_argv, folder), _in(folder, tmp_path, "base"))
  if base.refused:
    pytest.skip(f"{command} ({path}) is refused here: {base.line}")
  assert base.rc in (0, None) or base.compiled, f"{command} ({path}) without {flag}: {base}"
  given = example(command, action, path_argv)
  with_flag = run(_argv(command, [*path_argv, *given], folder), _in(folder, tmp_path, "flag"))
  if with_flag.refused:
    assert any(f in with_flag.line for f in action.option_strings), (
        f"{command} ({path}) {' '.join(given)}: refused, but the line does not name {flag}: {with_flag.line}")
    return
  # Exit 2 after the compile is the stand-in results' doing; before it, bad input is one line.
  assert with_flag.compiled or with_flag.rc != 2, (
      f"{command} ({path}) {' '.join(given)}: exit 2 with {len(with_flag.err)} lines: {with_flag.err}")
  assert not with_flag.same(base), f"{command} ({path}): {' '.join(given)} is accepted and changes nothing"
