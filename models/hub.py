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
(1, true, yes, on) reads only the cache (another word than on or off is refused).
"""

from __future__ import annotations

from pathlib import Path

from jaxmem.errors import JaxmemError
from jaxmem.inputs import env_text, hub_id, hub_offline, looks_like_hub_id


def parse_hub_id(name: str) -> tuple[str, str | None] | None:
  """(repo id, revision or None) if ``name`` names a Hub repository rather than a preset or a
  local file (:func:`jaxmem.inputs.looks_like_hub_id`, and no such path exists), else None. A
  name written as a Hub id that the Hub client's own validator refuses (``a/b--c``,
  ``a/b.git``) is a one-line error here, before the client is called
  (:func:`jaxmem.inputs.hub_id`)."""
  if not looks_like_hub_id(name) or Path(name).exists():
    return None
  hub = hub_id(name)
  return hub.repo, hub.revision


def _cache_dir() -> str | None:
  if hub_cache := env_text("HF_HUB_CACHE"):
    return hub_cache
  if home := env_text("HF_HOME"):
    return str(Path(home) / "hub")
  return None  # the client's default (~/.cache/huggingface/hub)


def offline() -> bool:
  return hub_offline()


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
