"""Texts in, rows out: reading an input file, encoding it, and running a step over its batches.

Every command reads one text a line (`read_texts`) and writes row i for line i: `run_batched`
groups rows of similar length into batches padded to `inference_buckets` and puts each output
back in input order.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
import tqdm

from bert_jax.data import batching
from bert_jax.data.text_io import encode_texts

PROGRESS_MIN_BATCHES = 20  # a progress bar from this many batches on (`progress=None`)
INPUT_COLUMNS = ("input_ids", "token_type_ids", "attention_mask")


def read_texts(path: str) -> tuple[list[str], list[str] | None]:
    """The texts of a file, one a line, so that output row i belongs to line i + 1; "a<TAB>b"
    lines (every line) make pairs.

    Blank lines at the end of the file are dropped; a blank line before the last text is an
    error naming it (a row of its own would be an embedding of nothing; skipping it would shift
    every later row). Bytes that are not UTF-8 are an error naming the line and byte offset,
    never replaced.

    Raises:
      ValueError: a blank line, invalid UTF-8, or no text at all, naming `path` and the line.
    """
    with open(path, "rb") as f:
        raw = f.read()
    lines, offset = [], 0
    for number, chunk in enumerate(raw.split(b"\n"), start=1):
        try:
            line = chunk.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(
                f"{path}: line {number} is not UTF-8: byte offset {offset + e.start} in the file "
                f"(byte {e.start} of the line) is {chunk[e.start : e.start + 1]!r}; save the "
                "file as UTF-8"
            ) from None
        lines.append(line.rstrip("\r").removeprefix("\ufeff") if number == 1 else line.rstrip("\r"))
        offset += len(chunk) + 1
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise ValueError(f"{path} holds no text")
    blank = [i for i, line in enumerate(lines, start=1) if not line.strip()]
    if blank:
        raise ValueError(
            f"{path}: line {blank[0]} is blank ({len(blank)} blank line(s) before the last text:"
            f" {blank[:10]}); every line is one text and output row i is line i, so remove them "
            "or put text there"
        )
    if all("\t" in line for line in lines):
        pairs = [line.split("\t", 1) for line in lines]
        return [a for a, _ in pairs], [b for _, b in pairs]
    return lines, None


def features(tokenizer, texts, texts_b, max_seq_length: int) -> dict[str, np.ndarray]:
    """The encoded texts (pairs with `texts_b`): input_ids, token_type_ids, attention_mask
    int32 [N, max_seq_length] and example_weights float32 [N] (ones); logs the truncation."""
    encoded, stats = encode_texts(tokenizer, list(texts), texts_b, max_seq_length)
    stats.log()
    encoded["example_weights"] = np.ones(len(texts), np.float32)
    return encoded


def inference_buckets(max_seq_length: int) -> tuple[int, ...]:
    """Token-axis sizes a batch is padded to: every 8 tokens up to 64, then every 32.

    Batches hold rows of similar length (grouped by bucket), and most sentences are short, so the
    fine steps at the start save most of the padding; each size compiles once per process.
    """
    fine = {b for b in range(8, 64, 8) if b < max_seq_length}
    return tuple(sorted(fine | set(batching.length_buckets(max_seq_length))))


def run_batched(
    step_fn,
    params,
    encoded: dict[str, np.ndarray],
    *,
    batch_size: int,
    buckets: Sequence[int] | None,
    progress: bool | None,
    desc: str,
    group_by_length: bool | None = None,
) -> np.ndarray:
    """`step_fn(params, batch)` -> [B, ...] over batches of the `features`, in input order.

    Rows are grouped by length bucket (each batch padded to its bucket); `buckets=None` pads every
    batch to the features' full length. `group_by_length=False` keeps the rows' order (rows already
    sorted by length make batches of neighbours, each cut to its bucket). The parameters go to the
    device once and enter every call as arguments, so each bucket compiles one program, whatever
    the parameters hold.
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    n = batching.num_rows(encoded)
    if n == 0:
        raise ValueError("no texts to run")
    params = jax.device_put(params)
    inputs = {k: encoded[k] for k in (*INPUT_COLUMNS, "example_weights")}
    total = batching.num_batches(n, batch_size)
    show = total >= PROGRESS_MIN_BATCHES if progress is None else progress
    bar = tqdm.tqdm(total=n, disable=not show, desc=desc, unit="text")
    outputs, indices, pending = [], [], None
    for batch, idx in batching.batches(
        inputs,
        batch_size,
        bucket_boundaries=buckets,
        # similar lengths together: little padding
        group_by_length=buckets is not None if group_by_length is None else group_by_length,
        return_indices=True,
    ):
        batch.pop("example_weights")
        out = step_fn(params, batch)  # dispatched asynchronously: the next batch is cut meanwhile
        if pending is not None:
            outputs.append(np.asarray(pending[0]))
            bar.update(pending[1])
        pending = (out, int(np.sum(idx >= 0)))
        indices.append(idx)
    outputs.append(np.asarray(pending[0]))
    bar.update(pending[1])
    bar.close()
    return batching.unbatch(outputs, indices, n)
