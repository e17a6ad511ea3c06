"""Every command with only ``--model PRESET --target T`` gets as far as its first compile on every
preset, or says in one line which option it needs: the defaults follow the model (a sequence no
longer than its learned positions, a batch the mesh divides), and a default that had to change
says so. Without compiling (tests/clistub.py); benchmarks/presets_defaults.py compiles them.
"""

from __future__ import annotations

import pytest

import jaxmem
from clistub import no_compiles, run

# A target whose compiler runs here without its hardware: 4 devices, so a batch of 1 (infer's
# default) does not divide its default mesh.
TARGET = "tpu:v5p-8"
COMMANDS = ("compare", "explain", "fit", "plan", "scale", "infer", "estimate", "validate")
# The commands that take no --target: a closed form, and real steps on the attached devices.
NO_TARGET = ("estimate", "validate")


@pytest.fixture(scope="module")
def stubbed(tmp_path_factory):
  with no_compiles(str(tmp_path_factory.mktemp("cache"))):
    yield


@pytest.mark.needs_tpu_compiler
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("model", list(jaxmem.PRESETS))
def test_only_model_and_target_plan_or_name_the_option_needed(command, model, stubbed, tmp_path):
  got = run([command, "--model", model, "--target", TARGET], tmp_path)
  if command in NO_TARGET:
    assert got.refused and "--target" in got.line, got.err
    got = run([command, "--model", model], tmp_path)  # validate: an accelerator is made to be attached
  assert got.compiled or got.rc == 0, f"{command} --model {model}: exit {got.rc}: {got.err}"


@pytest.mark.needs_tpu_compiler
@pytest.mark.parametrize(("argv", "said"), [
    (["infer", "--model", "gpt2-small"], "context 1024: gpt2-small's 1024 learned positions (default 2048)"),
    (["infer", "--model", "tiny-gpt2"], "prompt 256: tiny-gpt2's 256 learned positions (default 1024)"),
    (["infer", "--model", "tiny"], "batch 4: mesh fsdp=4's 4 data-parallel ways (default 1)"),
    (["compare", "--model", "tiny-gpt2"], "seq 256: tiny-gpt2's 256 learned positions (default 1024)"),
    (["compare", "--model", "tiny", "--microbatches", "4"],
     "batch 16: 4 microbatches x mesh fsdp=4's 4 data-parallel ways (default 8)"),
    (["compare", "--model", "tiny", "--target", "tpu:v5p-32"], "batch 16: mesh fsdp=16's 16 data-parallel ways (default 8)"),
])
def test_a_default_that_had_to_change_says_so(argv, said, stubbed, tmp_path):
  got = run([*argv, "--target", TARGET] if "--target" not in argv else argv, tmp_path)
  assert got.compiled, got.err
  assert f"jaxmem: {said}" in got.err, got.err


@pytest.mark.needs_tpu_compiler
@pytest.mark.parametrize("argv", [
    ["infer", "--model", "gpt2-small", "--context", "2048"],
    ["infer", "--model", "tiny", "--batch", "1"],
    ["compare", "--model", "tiny-gpt2", "--seq", "1024"],
    ["compare", "--model", "tiny", "--batch", "2"],
])
def test_a_value_given_is_never_changed_and_is_refused_in_one_line(argv, stubbed, tmp_path):
  got = run([*argv, "--target", TARGET], tmp_path)
  assert got.refused, got.err
