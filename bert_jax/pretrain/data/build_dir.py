"""The directory a shard build writes: its files, the checks that refuse other data, and resuming.

A build's directory holds, besides its shards (`shard_name`):

    build.json        what is being built (`build_plan`; written first by `start_build`)
    tokenizer.json, vocab.txt (WordPiece) or vocab.json, merges.txt, tokenizer_config.json (BPE)
    .build-tmp/       each finished shard's statistics until the build is complete
    metadata.json     shard list, record counts, options, statistics (`finish_build`; written
                      last: its presence means complete, `read_metadata` reads it)

A rerun with the same plan reuses finished shards (`finished_shard_stats`) or returns the finished
build (`finished_build`); anything else in the directory is refused with an `OutputDirectoryError`
naming the difference. `build` (one machine) and `beam_build` (Beam) share these rules.
"""

from __future__ import annotations

import json
import os
import re

from absl import logging
from etils import epath

from bert_jax.paths import write_text_whole
from bert_jax.pretrain.data.examples import PretrainingOptions

BUILD_FORMAT = "bert_jax.pretraining_shards/1"
BUILD_FILE = "build.json"
METADATA_FILE = "metadata.json"
TMP_DIR = ".build-tmp"
# The tokenizer's files of every kind (`tokenization.SubwordTokenizer.files`).
_TOKENIZER_FILES = {
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "tokenizer_config.json",
}
_OWN_FILES = {BUILD_FILE, METADATA_FILE, TMP_DIR, *_TOKENIZER_FILES}
_SHARD_RE = re.compile(r"^pretrain-(\d{5})-of-(\d{5})\.(array_record|tfrecord)$")
_TMP_SHARD_RE = re.compile(r"^\.pretrain-\d{5}-of-\d{5}\.(array_record|tfrecord)\.tmp-\d+$")


class OutputDirectoryError(ValueError):
    """The output directory holds data that is not this build's."""


def shard_name(index: int, count: int, record_format: str) -> str:
    """The file name of shard `index` of `count`."""
    return f"pretrain-{index:05d}-of-{count:05d}.{record_format}"


def shard_stats_path(out_dir: str, name: str) -> str:
    """Where a finished shard's statistics are kept until metadata.json is written."""
    return os.fspath(epath.Path(out_dir) / TMP_DIR / f"{name}.json")


def finished_shard_stats(out_dir: str, name: str) -> dict | None:
    """The statistics of shard file `name` if it is finished (file and statistics), else None."""
    if _is_file(out_dir, name) and epath.Path(shard_stats_path(out_dir, name)).is_file():
        return read_json(shard_stats_path(out_dir, name))
    return None


# ---- Files and checks ----


def write_json(path: str, obj) -> None:
    """Writes `obj` as indented JSON, whole (`paths.write_text_whole`); makes its directory."""
    path = epath.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_whole(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: str):
    """The JSON value in a file (local or a URL)."""
    return json.loads(epath.Path(path).read_text(encoding="utf-8"))


def check_output_dir(out_dir: str) -> None:
    """Refuses a directory that holds anything a build does not write."""
    directory = epath.Path(out_dir)
    if not directory.exists():
        return
    if not directory.is_dir():
        raise OutputDirectoryError(f"output path {out_dir} exists and is not a directory")
    foreign = sorted(
        name
        for name in _listdir(out_dir)
        if name not in _OWN_FILES and not _SHARD_RE.match(name) and not _TMP_SHARD_RE.match(name)
    )
    if foreign:
        raise OutputDirectoryError(
            f"output directory {out_dir} already holds other data ({', '.join(foreign[:5])}"
            f"{', ...' if len(foreign) > 5 else ''}); pass an empty or new directory"
        )


def _listdir(out_dir: str) -> list[str]:
    return [p.name for p in epath.Path(out_dir).iterdir()]


def _is_file(out_dir: str, name: str) -> bool:
    return (epath.Path(out_dir) / name).is_file()


def check_existing_tokenizer(out_dir: str, tokenizer) -> None:
    """Refuses a directory whose tokenizer files are not `tokenizer`'s."""
    from bert_jax import tokenization

    json_path = os.fspath(epath.Path(out_dir) / "tokenizer.json")
    if _is_file(out_dir, "tokenizer.json"):
        if tokenization.load_tokenizer(json_path).fingerprint() != tokenizer.fingerprint():
            raise OutputDirectoryError(
                f"{json_path} is a different tokenizer from the one given; use a new output "
                "directory"
            )
    vocab_path = os.fspath(epath.Path(out_dir) / "vocab.txt")
    if _is_file(out_dir, "vocab.txt"):
        try:
            same = list(tokenization.read_vocab_txt(vocab_path)) == tokenizer.vocab
        except ValueError:
            same = False
        if not same:
            raise OutputDirectoryError(
                f"{vocab_path} is not the vocabulary of the tokenizer given; use a new output "
                "directory"
            )
    files = tokenizer.files()
    for name in sorted(_TOKENIZER_FILES - {"tokenizer.json", "vocab.txt"}):
        if _is_file(out_dir, name) and (epath.Path(out_dir) / name).read_text() != files.get(name):
            raise OutputDirectoryError(
                f"{os.fspath(epath.Path(out_dir) / name)} is not a file of the tokenizer given; "
                "use a new output directory"
            )


def _save_tokenizer(out_dir: str, tokenizer) -> None:
    """Writes the tokenizer files that are missing (existing ones were checked to match)."""
    for name, text in tokenizer.files().items():
        path = epath.Path(out_dir) / name
        if not path.exists():
            write_text_whole(path, text)


def _plan_difference(old: dict, new: dict) -> str:
    keys = sorted(set(old) | set(new))
    diffs = [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]
    return "; ".join(diffs)


def _check_plan(out_dir: str, plan: dict) -> None:
    """Refuses a directory holding a build with other settings or another tokenizer."""
    path = os.fspath(epath.Path(out_dir) / BUILD_FILE)
    if _is_file(out_dir, BUILD_FILE):
        old = read_json(path)
        if old != plan:
            raise OutputDirectoryError(
                f"{out_dir} holds a build with different settings ({_plan_difference(old, plan)}); "
                "use a new directory, or delete this one to rebuild"
            )
    expected = {
        shard_name(i, plan["num_shards"], plan["record_format"]) for i in range(plan["num_shards"])
    }
    other = sorted(n for n in _listdir(out_dir) if _SHARD_RE.match(n) and n not in expected)
    if other:
        raise OutputDirectoryError(
            f"{out_dir} holds shards of another build ({', '.join(other[:3])}); use a new directory"
        )


def _complete_metadata(out_dir: str, plan: dict) -> dict | None:
    """The metadata of a finished build of `plan` in `out_dir`, or None."""
    if not _is_file(out_dir, METADATA_FILE):
        return None
    metadata = read_json(os.fspath(epath.Path(out_dir) / METADATA_FILE))
    if metadata.get("plan") != plan:
        return None
    if all(_is_file(out_dir, s["path"]) for s in metadata["shards"]):
        return metadata
    return None


def read_metadata(path: str | os.PathLike) -> dict:
    """The `metadata.json` of a built directory (or the file itself).

    Raises:
      FileNotFoundError: there is none (the build is missing or unfinished).
    """
    path = epath.Path(path)  # a local directory or a URL (gs://...): read-only here
    if path.is_dir():
        path = path / METADATA_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {METADATA_FILE} at {path.parent}: not a finished build")
    return json.loads(path.read_text(encoding="utf-8"))


# ---- A build's life: plan, start, finish ----


def build_plan(
    options: PretrainingOptions,
    tokenizer,
    corpus_id: str,
    num_shards: int,
    record_format: str,
    partition: str,
) -> dict:
    """What a build is (build.json): a rerun with another plan is refused, not mixed in."""
    plan = {
        "format": BUILD_FORMAT,
        "options": options.to_dict(),
        "tokenizer": tokenizer.fingerprint(),
        "corpus": corpus_id,
        "num_shards": num_shards,
        "record_format": record_format,
    }
    if partition != "shuffled":  # Absent for the default, so older builds stay recognised.
        plan["partition"] = partition
    return plan


def finished_build(out_dir: str, plan: dict) -> dict | None:
    """The metadata of a finished build of `plan` in `out_dir`, or None; refuses other builds."""
    if not epath.Path(out_dir).is_dir():
        return None
    _check_plan(out_dir, plan)
    done = _complete_metadata(out_dir, plan)
    if done is not None:
        logging.info("%s: complete build found, %d records", out_dir, done["num_records"])
    return done


def start_build(out_dir: str, plan: dict, tokenizer) -> None:
    """Writes build.json and the tokenizer, and deletes an interrupted build's temporary shards."""
    (epath.Path(out_dir) / TMP_DIR).mkdir(parents=True, exist_ok=True)
    write_json(os.fspath(epath.Path(out_dir) / BUILD_FILE), plan)
    _save_tokenizer(out_dir, tokenizer)
    for name in _listdir(out_dir):
        if _TMP_SHARD_RE.match(name):  # Left by an interrupted build.
            (epath.Path(out_dir) / name).unlink()


def finish_build(
    out_dir: str,
    plan: dict,
    shard_stats: dict[int, dict],
    options: PretrainingOptions,
    tokenizer,
    corpus_stats: dict,
    source_stats: dict | None,
) -> dict:
    """Writes metadata.json (the build is complete from then on) and drops the temporary files.

    Args:
      out_dir: the build's directory.
      plan: its `build_plan`.
      shard_stats: every shard's `ShardWriter.write` statistics, by shard index.
      options, tokenizer: the build's.
      corpus_stats: the fields of `corpus.CorpusStats`.
      source_stats: `sources.SourceStats.to_dict()`, or None.

    Returns:
      The metadata.
    """
    num_shards = plan["num_shards"]
    record_format = plan["record_format"]
    totals = {k: sum(s[k] for s in shard_stats.values()) for k in next(iter(shard_stats.values()))}
    metadata = {
        "format": BUILD_FORMAT,
        "plan": plan,
        "record_format": record_format,
        "shards": [
            {
                "path": shard_name(i, num_shards, record_format),
                "num_records": shard_stats[i]["num_records"],
            }
            for i in range(num_shards)
        ],
        "num_records": totals["num_records"],
        "options": options.to_dict(),
        "tokenizer": _tokenizer_metadata(tokenizer),
        "corpus": corpus_stats,
        "source": source_stats,
        "stats": _record_stats(totals),
    }

    write_json(os.fspath(epath.Path(out_dir) / METADATA_FILE), metadata)
    (epath.Path(out_dir) / TMP_DIR).rmtree(missing_ok=True)
    logging.info(
        "%s: %d records in %d %s shard(s); %.1f tokens/record, %.1f%% random next",
        out_dir,
        metadata["num_records"],
        plan["num_shards"],
        plan["record_format"],
        metadata["stats"]["mean_tokens"],
        100 * metadata["stats"]["random_next_fraction"],
    )
    return metadata


def _tokenizer_metadata(tokenizer) -> dict:
    """What metadata.json records of the tokenizer: fingerprint, size, case, special ids."""
    return {
        "fingerprint": tokenizer.fingerprint(),
        "vocab_size": tokenizer.vocab_size,
        "lowercase": tokenizer.lowercase,
        "pad_id": tokenizer.pad_id,
        "unk_id": tokenizer.unk_id,
        "cls_id": tokenizer.cls_id,
        "sep_id": tokenizer.sep_id,
        "mask_id": tokenizer.mask_id,
    }


def _record_stats(totals: dict) -> dict:
    """metadata.json's "stats": per-record means and fractions of the summed shard statistics."""
    n = max(totals["num_records"], 1)
    return {
        "random_next_fraction": totals["random_next"] / n,
        "mean_tokens": totals["tokens"] / n,
        "full_length_fraction": totals["full_length"] / n,
        "mean_predictions": totals["predictions"] / n,
    }
