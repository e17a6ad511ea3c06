"""A model's ``config.json`` from the Hugging Face Hub by repository id, and nothing else.

``ORG/NAME`` (e.g. ``google/gemma-3-27b-it``), optionally ``ORG/NAME@REVISION`` (a branch, tag
or commit), names a Hub repository; :func:`config_path` fetches only its ``config.json`` through
``huggingface_hub`` (never the weights) and returns the local file, which
:func:`.hf.from_config` reads. What the Hub client itself honours is honoured: the token from
the usual environment (``HF_TOKEN``, or the one ``huggingface-cli login`` stored; gated
repositories such as Llama and Gemma need it), and the local cache (a file already cached is
not fetched again). The cache directory and offline mode are read here at each call rather than
from the client's import-time constants, so that they follow the environment the caller has
now: ``HF_HUB_CACHE``, else ``HF_HOME``/hub, else the client's default; ``HF_HUB_OFFLINE`` set
(1, true, yes, on) reads only the cache.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from jaxmem.errors import JaxmemError

# A Hub repository id: ORG/NAME with the Hub's characters (letters, digits, - _ .), optionally
# @REVISION. A local path is told apart by existing, or by a leading / . ~.
_REPO_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<rev>[\w./-]+))?$")
_TRUE = ("1", "true", "yes", "on")


def parse_hub_id(name: str) -> tuple[str, str | None] | None:
  """(repo id, revision or None) if ``name`` names a Hub repository rather than a preset or a
  local file, else None."""
  if not isinstance(name, str) or name.startswith(("/", ".", "~")) or name.lower().endswith(".json"):
    return None
  m = _REPO_ID.match(name)
  if m is None or Path(name).exists():
    return None
  return m.group("repo"), m.group("rev")


def _cache_dir() -> str | None:
  if os.environ.get("HF_HUB_CACHE"):
    return os.environ["HF_HUB_CACHE"]
  if os.environ.get("HF_HOME"):
    return str(Path(os.environ["HF_HOME"]) / "hub")
  return None  # the client's default (~/.cache/huggingface/hub)


def offline() -> bool:
  return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def _pass_a_file(repo: str) -> str:
  return (
    f"download {repo}'s config.json (https://huggingface.co/{repo}/blob/main/config.json) and pass its path: "
    "--model path/to/config.json"
  )


def config_path(repo: str, *, revision: str | None = None) -> Path:
  """The local path of ``repo``'s ``config.json`` at ``revision`` (None: the default branch),
  fetched into the Hub cache unless it is there already.

  Raises:
    JaxmemError: one line, saying how to pass the file instead, when ``huggingface_hub`` is not
      installed, the file is not cached and the Hub cannot be reached (or ``HF_HUB_OFFLINE`` is
      set), or the repository, revision or file does not exist or is gated.
  """
  try:
    import huggingface_hub
    from huggingface_hub.utils import (
      EntryNotFoundError,
      GatedRepoError,
      HfHubHTTPError,
      LocalEntryNotFoundError,
      RepositoryNotFoundError,
      RevisionNotFoundError,
    )
  except ImportError:
    raise JaxmemError(f"reading {repo} from the Hub needs huggingface_hub (pip install huggingface_hub); or {_pass_a_file(repo)}") from None
  at = f"{repo}@{revision}" if revision else repo
  local = offline()
  try:
    path = huggingface_hub.hf_hub_download(
      repo, "config.json", revision=revision, cache_dir=_cache_dir(), local_files_only=local,
    )
  except LocalEntryNotFoundError:
    why = "HF_HUB_OFFLINE is set" if local else "the Hub cannot be reached"
    raise JaxmemError(f"{at}: config.json is not in the local Hub cache and {why}; {_pass_a_file(repo)}") from None
  except GatedRepoError:
    raise JaxmemError(
      f"{at} is gated: accept its licence on the Hub and set HF_TOKEN (or `huggingface-cli login`); or {_pass_a_file(repo)}"
    ) from None
  except RepositoryNotFoundError:
    raise JaxmemError(f"{at}: no such model repository on the Hub (or it is private: set HF_TOKEN)") from None
  except RevisionNotFoundError:
    raise JaxmemError(f"{at}: no such revision of {repo}") from None
  except EntryNotFoundError:
    raise JaxmemError(f"{at} has no config.json (jaxmem reads Transformers-style checkpoints)") from None
  except (HfHubHTTPError, OSError) as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise JaxmemError(f"{at}: config.json could not be fetched ({first}); {_pass_a_file(repo)}") from None
  return Path(path)
