"""Library errors name the field (`microbatches`); the CLI words them as its flags."""

import ast
import pathlib
import re

import pytest

import jaxmem
import jaxmem.models
from jaxmem.cli import build_parser, main
from jaxmem.cli._common import flags_by_field
from jaxmem.errors import JaxmemError

ROOT = pathlib.Path(jaxmem.__file__).parent
MODELS = pathlib.Path(jaxmem.models.__file__).parent


def _library_files():
  """Every module of the library (the CLI aside: it words fields as flags) and of the models."""
  yield from (p for p in ROOT.rglob("*.py") if "cli" not in p.relative_to(ROOT).parts)
  yield from MODELS.rglob("*.py")


def _messages(path: pathlib.Path):
  """The literal text of every ``JaxmemError(...)`` raised in ``path``, with its line."""
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "JaxmemError" and node.args:
      parts = [n.value for n in ast.walk(node.args[0]) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
      yield node.lineno, "".join(parts)


def test_library_errors_name_no_cli_flags():
  flagged = [f"{p}:{line}: {text}" for p in _library_files() for line, text in _messages(p)
             if re.search(r"(?<![\w-])--[a-z]", text)]
  assert not flagged, "\n".join(flagged)


def test_an_error_says_which_fields_and_words_them():
  e = JaxmemError("`vocab_tiles` must divide `seq` 100 (got 3); `seq` is the sequence")
  assert e.fields == ("vocab_tiles", "seq")
  assert e.worded({"vocab_tiles": "--vocab-tiles"}) == "--vocab-tiles must divide seq 100 (got 3); seq is the sequence"


def test_the_cli_knows_every_fields_flag():
  flags = flags_by_field(build_parser())
  assert flags["microbatches"] == "--microbatches" and flags["vocab_tiles"] == "--vocab-tiles"
  assert flags["capacity_factor"] == "--capacity-factor" and flags["over"] == "--over"
  assert flags["weights"] == "--weights" and flags["jobs"] == "--jobs"


def test_library_names_the_field_and_the_cli_the_flag(capsys):
  with pytest.raises(JaxmemError) as err:
    jaxmem.compare(model="tiny", microbatches=0)
  assert err.value.fields == ("microbatches",) and "--" not in str(err.value)
  assert main(["compare", "--model", "tiny", "--microbatches", "0"]) == 2
  assert capsys.readouterr().err.strip() == "jaxmem: error: --microbatches must be whole numbers of at least 1 (got 0)"
  assert main(["infer", "--model", "tiny", "--weights", ","]) == 2
  assert "--weights is empty" in capsys.readouterr().err
