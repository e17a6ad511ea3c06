"""Every value that reaches jaxmem from outside, parsed into a typed value where it enters.

A CLI flag's text, an environment variable, a field of a ``config.json``, a Hub id, a MaxText
``key=value`` override, a saved result's provenance and a public function's keyword are read
here, by one parser for each kind of value, and anything else is refused in one line: a
:class:`~jaxmem.errors.BadValue` naming what it was given for (`batch`, ``--batch``,
``field 'hidden_size'``, ``XLA_CLIENT_MEM_FRACTION``), what it must be, and what it was. What a
parser returns is the typed value the rest of jaxmem works on; nothing downstream checks it
again.

A leaf module (it imports only :mod:`jaxmem.errors` and :mod:`jaxmem.sizes`), so the axes, the
models' ``config.json`` reader, the library's entry points and the CLI all parse with the same
parsers. A parser is a frozen, hashable object: ``parser(value)`` parses (argparse takes it as a
flag's ``type=``: the CLI's parser names the flag in the refusal), ``parser(value, subject)``
names the subject itself, and its fields say what it takes (the property-based tests generate
values inside and outside that domain from them).

>>> Whole()("8")
8
>>> Whole()("0", "`batch`")
Traceback (most recent call last):
...
jaxmem.errors.BadValue: `batch` must be a whole number of at least 1, got '0'
>>> Fraction()("0.9")
0.9
>>> Choice(("table", "json"))("csv", "--format")
Traceback (most recent call last):
...
jaxmem.errors.BadValue: --format must be one of table, json, got 'csv'
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from jaxmem.errors import BadValue, JaxmemError
from jaxmem.sizes import byte_count

# What a refusal names when its caller names nothing (argparse calls a flag's type with the text
# alone; the CLI's parser then names the flag instead).
VALUE = "the value"


# --- numbers and names, from text (a flag, a variable) or from Python (a keyword, JSON) ---


@dataclasses.dataclass(frozen=True)
class Whole:
  """A whole number from ``least`` up to ``most``: an ``int`` (not a bool), or text of digits
  (``"8"``, ``" 8 "``, ``"-1"`` where ``least`` allows it). ``json``: only a JSON integer (a
  config.json field), never text."""

  least: int | None = 1
  most: int | None = None
  json: bool = False

  @property
  def expected(self) -> str:
    what = "an integer" if self.json else "a whole number"
    if self.least is not None and self.most is not None:
      return f"{what} from {self.least} to {self.most}"
    return what + (f" of at least {self.least}" if self.least is not None else "") + (
        f" of at most {self.most}" if self.most is not None else "")

  def __call__(self, value: Any, subject: str = VALUE) -> int:
    n = _whole(value, text=not self.json)
    if n is None or (self.least is not None and n < self.least) or (self.most is not None and n > self.most):
      raise BadValue(subject, self.expected, value)
    return n


def _whole(value: Any, *, text: bool) -> int | None:
  if isinstance(value, bool):
    return None
  if isinstance(value, int):
    return value
  # Spaces and tabs around the digits only: re's \s takes characters int() does not (U+001F).
  if text and isinstance(value, str) and (m := re.fullmatch(r"[ \t\r\n]*([+-]?[0-9]{1,30})[ \t\r\n]*", value)):
    return int(m.group(1))
  return None


@dataclasses.dataclass(frozen=True)
class Number:
  """A finite number above ``above`` and below ``below`` (both exclusive), from ``least`` up to
  ``most`` (inclusive): an ``int`` or ``float`` (not a bool), or its text. ``json``: only a
  JSON number."""

  above: float | None = None
  least: float | None = None
  most: float | None = None
  below: float | None = None
  json: bool = False

  @property
  def expected(self) -> str:
    parts = [f"above {self.above:g}" if self.above is not None else "",
             f"at least {self.least:g}" if self.least is not None else "",
             f"at most {self.most:g}" if self.most is not None else "",
             f"below {self.below:g}" if self.below is not None else ""]
    bounds = " and ".join(p for p in parts if p)
    return "a number" + (f" {bounds}" if bounds else "")

  def __call__(self, value: Any, subject: str = VALUE) -> float:
    x = _number(value, text=not self.json)
    if (x is None or (self.above is not None and not x > self.above) or (self.least is not None and x < self.least)
        or (self.most is not None and x > self.most) or (self.below is not None and not x < self.below)):
      raise BadValue(subject, self.expected, value)
    return x


def _number(value: Any, *, text: bool) -> float | None:
  if isinstance(value, bool):
    return None
  if isinstance(value, (int, float)):
    x = float(value) if abs(value) < 1e308 or isinstance(value, float) else math.inf
  elif text and isinstance(value, str):
    try:
      x = float(value)
    except ValueError:
      return None
  else:
    return None
  return x if math.isfinite(x) else None


@dataclasses.dataclass(frozen=True)
class Fraction(Number):
  """A share of something: a number in (0, 1] (``0.9``)."""

  above: float | None = 0.0
  most: float | None = 1.0

  @property
  def expected(self) -> str:
    return "a fraction in (0, 1] such as 0.9"


@dataclasses.dataclass(frozen=True)
class Size:
  """A size in bytes (:func:`jaxmem.sizes.byte_count`): an ``int``, or text such as ``14.5GiB``,
  ``512MiB`` or ``1000000``. ``optional``: ``None`` is 0 bytes; otherwise it is refused."""

  optional: bool = False
  expected: str = "a size in bytes such as 14.5GiB, 512MiB or 1000000"

  def __call__(self, value: Any, subject: str = VALUE) -> int:
    if value is None and self.optional:
      return 0
    if value is None or isinstance(value, bool) or not isinstance(value, (int, str)):
      raise BadValue(subject, self.expected, value)
    try:
      return byte_count(value, "size")
    except JaxmemError:
      raise BadValue(subject, self.expected, value) from None


@dataclasses.dataclass(frozen=True)
class Choice:
  """One of ``values`` (``listed``: a comma-separated list of them, each once, in the order
  given, or ``all`` for every one where ``every`` says so), as a string; a list or tuple of them
  from Python too."""

  values: tuple[str, ...]
  listed: bool = False
  every: bool = False

  @property
  def expected(self) -> str:
    one = f"one of {', '.join(self.values)}"
    if not self.listed:
      return one
    return f"{one}, or several separated by commas" + (", or all" if self.every else "")

  def __call__(self, value: Any, subject: str = VALUE) -> Any:
    if not self.listed:
      if not isinstance(value, str) or value.strip() not in self.values:
        raise BadValue(subject, self.expected, value)
      return value.strip()
    parts = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if parts is None or not all(isinstance(p, str) for p in parts):
      raise BadValue(subject, self.expected, value)
    names = [n.strip() for p in parts for n in p.split(",") if n.strip()]
    if self.every and names == ["all"]:
      return self.values
    if not names or any(n not in self.values for n in names):
      raise BadValue(subject, self.expected, value)
    return tuple(dict.fromkeys(names))


@dataclasses.dataclass(frozen=True)
class Switch:
  """On or off: a bool, or text (``1``, ``true``, ``yes``, ``on``; ``0``, ``false``, ``no``,
  ``off``; any case; empty is off)."""

  expected: str = "on or off (1, true, yes, on; 0, false, no, off)"

  def __call__(self, value: Any, subject: str = VALUE) -> bool:
    if isinstance(value, bool):
      return value
    if isinstance(value, str):
      word = value.strip().lower()
      if word in _ON:
        return True
      if word in _OFF:
        return False
    raise BadValue(subject, self.expected, value)


_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class Text:
  """A name or a path: a string with something in it, on one line, without NUL (which no file
  name or identifier holds). ``pattern``: a regular expression it must match in full,
  ``expected`` saying it in words."""

  pattern: str | None = None
  expected: str = "a non-empty string"

  def __call__(self, value: Any, subject: str = VALUE) -> str:
    if (not isinstance(value, str) or not value.strip() or "\x00" in value or "\n" in value
        or (self.pattern is not None and re.fullmatch(self.pattern, value.strip()) is None)):
      raise BadValue(subject, self.expected, value)
    return value.strip()


# A Dask scheduler's address (distributed.comm's forms): tcp://HOST:PORT, or HOST:PORT (tcp), or
# another of its protocols, whose client decides the rest.
ADDRESS = Text(pattern=r"(?:(?:tcp|tls|inproc|ucx|ws|wss)://)?[^\s/:]+(?::\d{1,5})?(?:/[^\s]*)?",
               expected="a Dask scheduler's address such as tcp://host:8786")
# A step factory's import path: package.module:make_step or path/to/file.py:make_step.
STEP = Text(pattern=r"[^\s:][^:]*:[A-Za-z_][\w.]*",
            expected="an import path package.module:make_step or path/to/file.py:make_step")


def optional(parser: Any, value: Any, subject: str = VALUE) -> Any:
  """``parser(value, subject)``, or ``None`` where ``value`` is ``None`` (an argument not given)."""
  return None if value is None else parser(value, subject)


# --- the environment ---


def env_switch(name: str, environ: Mapping[str, str] | None = None) -> bool:
  """An on/off variable (:class:`Switch`): unset or empty is off; anything but the switch's
  words is refused, naming the variable."""
  value = (os.environ if environ is None else environ).get(name, "")
  return Switch()(value, name)


def env_text(name: str, environ: Mapping[str, str] | None = None) -> str | None:
  """A variable's value, stripped; ``None`` where it is unset or empty."""
  value = (os.environ if environ is None else environ).get(name, "").strip()
  return value or None


def env_fraction(names: Sequence[str], environ: Mapping[str, str] | None = None) -> tuple[float, str] | None:
  """(the value, its variable) of the first of ``names`` that is set, as a :class:`Fraction`;
  ``None`` where none is."""
  for name in names:
    value = env_text(name, environ)
    if value is not None:
      return Fraction()(value, name), name
  return None


# jaxmem's own variables, read where they apply; :func:`check_environment` reads them all at once.
SWITCHES = ("JAXMEM_TRACEBACK", "JAXMEM_NO_PROGRESS", "JAXMEM_VERBOSE")
# The GPU allocator's share: jax 0.11 renamed XLA_PYTHON_CLIENT_MEM_FRACTION to
# XLA_CLIENT_MEM_FRACTION and deprecated the old name (both are read; the new one wins).
MEM_FRACTION_VARIABLES = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")


def check_environment(environ: Mapping[str, str] | None = None) -> None:
  """Every variable of jaxmem's own that is set, parsed: the CLI calls it first, so a bad value
  is one line before anything runs (and before the error handler reads ``JAXMEM_TRACEBACK``).
  ``HF_HUB_OFFLINE`` is read as the Hub client reads it (:data:`HUB_OFFLINE`)."""
  for name in SWITCHES:
    env_switch(name, environ)
  hub_offline(environ)
  env_fraction(MEM_FRACTION_VARIABLES, environ)


def hub_offline(environ: Mapping[str, str] | None = None) -> bool:
  """``HF_HUB_OFFLINE``: the Hub client's words for on (1, true, yes, on) and off (0, false,
  no, off, unset or empty); anything else is refused rather than read as off."""
  return env_switch("HF_HUB_OFFLINE", environ)


# --- a Hugging Face Hub id ---


@dataclasses.dataclass(frozen=True, kw_only=True)
class HubId:
  """A Hub repository (``ORG/NAME``) and a revision (a branch, tag or commit; ``None``: the
  default branch)."""

  repo: str
  revision: str | None = None


# ORG/NAME[@REVISION] as a --model names one: a local path is told apart by a leading / . ~ (or
# by existing, which the caller checks), a file by its .json.
_HUB_LIKE = re.compile(r"^(?P<repo>[^/@\s]+/[^/@\s]+)(?:@(?P<rev>[^@\s]+))?$")
_REVISION = re.compile(r"[\w./-]{1,255}")


def looks_like_hub_id(name: str) -> bool:
  """Whether ``name`` is written as a Hub id (``ORG/NAME`` or ``ORG/NAME@REVISION``) rather
  than a path or a preset; :func:`hub_id` then says whether it is a valid one."""
  return (isinstance(name, str) and not name.startswith(("/", ".", "~")) and not name.lower().endswith(".json")
          and _HUB_LIKE.match(name) is not None)


def hub_id(name: str, subject: str = "`model`") -> HubId:
  """``ORG/NAME[@REVISION]`` checked as the Hub client checks a repository id
  (``huggingface_hub.utils.validate_repo_id``: its characters, length, no ``--`` or ``..``, not
  ``.git``) and a revision of branch, tag or commit characters; a bad one is refused in one line
  here instead of raising the client's ``HFValidationError``."""
  m = _HUB_LIKE.match(name) if isinstance(name, str) else None
  # Whitespace is in no repository id; older Hub clients' validate_repo_id let it through to the
  # request, which then raised HFValidationError (seen with huggingface_hub beside jax 0.10.2).
  if m is None or any(ch.isspace() for ch in name):
    raise BadValue(subject, "a Hub id ORG/NAME or ORG/NAME@REVISION", name)
  repo, revision = m.group("repo"), m.group("rev")
  try:
    from huggingface_hub.utils import HFValidationError, validate_repo_id
  except ImportError:  # the caller says how to do without the client
    return HubId(repo=repo, revision=revision)
  try:
    validate_repo_id(repo)
  except HFValidationError as e:
    reason = str(e).split(":")[0].rstrip(".")
    raise JaxmemError(f"{subject} {name!r} is not a Hub repository id ({reason})") from None
  if revision is not None and _REVISION.fullmatch(revision) is None:
    raise BadValue(f"the revision of {subject} {name!r}", "a branch, tag or commit (letters, digits, . _ - /)", revision)
  return HubId(repo=repo, revision=revision)


# --- MaxText's overrides ---


_OVERRIDE_KEY = re.compile(r"[A-Za-z_][\w.]*")


def maxtext_args(value: str | Sequence[str] | None, subject: str = "`maxtext`") -> tuple[str, ...] | None:
  """A MaxText step's arguments as train_compile takes them: a config (a name in MaxText's
  ``configs`` or a path), then ``key=value`` overrides (:func:`override`); one string is split
  as a shell would. ``None``: no MaxText step."""
  import shlex

  if value is None:
    return None
  if isinstance(value, str):
    try:
      parts = shlex.split(value)
    except ValueError as e:  # an unclosed quote
      raise JaxmemError(f"{subject} {value!r} cannot be split into arguments: {e}") from None
  elif isinstance(value, (list, tuple)) and all(isinstance(p, str) for p in value):
    parts = list(value)
  else:
    raise BadValue(subject, "a MaxText config and key=value overrides (a string or a list of strings)", value)
  if not parts:
    raise JaxmemError(f"{subject} needs a MaxText config, e.g. base.yml, then its overrides key=value")
  if "=" in parts[0] or not parts[0].strip() or "\x00" in parts[0]:
    raise JaxmemError(f"{subject} starts with a MaxText config (base.yml or a path), then key=value; got {parts[0]!r}")
  for p in parts[1:]:
    override(p, subject)
  return tuple(parts)


def override(text: str, subject: str = "`maxtext`") -> tuple[str, str]:
  """``key=value`` (a MaxText option and its value) as ``(key, value)``: the key an option
  name (letters, digits, ``_`` and ``.``), the value anything, empty included."""
  key, eq, value = text.partition("=") if isinstance(text, str) else ("", "", "")
  if not eq or _OVERRIDE_KEY.fullmatch(key) is None:
    raise JaxmemError(f"{subject} overrides are key=value (MaxText's own options); got {text!r}")
  return key, value


# --- JSON as loaded: config.json fields and saved results ---


def strict_json(text: str, subject: str) -> Any:
  """``text`` as JSON, standard JSON only: Python's reader also takes ``NaN`` and ``Infinity``,
  which no JSON writer of jaxmem's or Hugging Face's emits and no figure can hold."""
  import json

  def refuse(constant: str) -> Any:
    raise JaxmemError(f"{subject} is not valid JSON: {constant} is not a JSON number")

  try:
    return json.loads(text, parse_constant=refuse)
  except RecursionError:
    raise JaxmemError(f"{subject} is not a JSON document jaxmem reads: nested too deeply") from None
  except json.JSONDecodeError as e:
    raise JaxmemError(f"{subject} is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None


def json_object(value: Any, subject: str) -> Mapping[str, Any]:
  if not isinstance(value, Mapping):
    raise BadValue(subject, "a JSON object", value)
  return value


def json_list(value: Any, subject: str, *, length: int | None = None) -> list[Any]:
  if not isinstance(value, list):
    raise BadValue(subject, "a JSON list", value)
  if length is not None and len(value) != length:
    raise BadValue(subject, f"a list of {length} (one per layer)" if length != 1 else "a list of one", value)
  return value


def json_string(value: Any, subject: str) -> str:
  if not isinstance(value, str):
    raise BadValue(subject, "a string", value)
  return value


def json_bool(value: Any, subject: str) -> bool:
  if not isinstance(value, bool):
    raise BadValue(subject, "true or false", value)
  return value


# --- what made a saved result ---

# The kinds of record a saved result holds (its made_by.kind), one per renderer of a command's
# JSON: a sweep's train-step rows (compare, scale, fit's ranked configurations), explain's
# explanation (and of a configuration the compiler refused), infer's rows, fit's largest workloads, a serving fit's, fit --remat search's
# assignment, compare --residuals' policies, estimate's closed forms, plan's search, validate's
# measurements, the presets, the targets, a diff.
ROWS, EXPLANATION, INFERENCE, FIT, SERVING, TENSOR_SEARCH = "rows", "explanation", "inference rows", "fit results", "serving fits", "tensor search"
RESIDUALS, ESTIMATES, PLAN, MEASUREMENTS, MODELS, TARGETS, DIFF = "residuals", "estimates", "plan", "measurements", "models", "targets", "diff"
KV_CACHE = "kv cache"
REFUSAL = "refusal explanation"  # explain's account of a configuration the compiler refused


@dataclasses.dataclass(frozen=True, kw_only=True)
class MadeBy:
  """What made a saved result (its JSON's top-level ``made_by``): the ``command`` that wrote it
  (``compare``; ``None`` where unknown: rows in hand, or a file written before results said), the
  ``kind`` of record it holds (``rows``: a sweep's train-step rows; ``explanation``,
  ``inference rows``... one per renderer) and jaxmem's ``version``. Two results compare when
  their kinds agree and their commands do where both are known."""

  command: str | None
  kind: str
  version: str | None = None

  def as_dict(self) -> dict[str, Any]:
    return {"command": self.command, "version": self.version, "kind": self.kind}

  @classmethod
  def read(cls, value: Any, subject: str) -> MadeBy:
    """A saved ``made_by`` as written (:meth:`as_dict`), its fields checked."""
    d = json_object(value, f"{subject}'s made_by")
    command, version = d.get("command"), d.get("version")
    kind = json_string(d.get("kind"), f"{subject}'s made_by.kind")
    for name, v in (("command", command), ("version", version)):
      if v is not None:
        json_string(v, f"{subject}'s made_by.{name}")
    return cls(command=command, kind=kind, version=version)
