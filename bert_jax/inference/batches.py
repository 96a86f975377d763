"""Texts in, rows out: reading an input file, encoding it, and running a step over its batches.

Every command reads one text a line (`read_texts`) and writes row i for line i: `run_batched`
packs the texts several to a row (`batching.pack`, fine-tuning's packer: segment ids, positions
restarting at each text) or groups rows of similar length into batches padded to
`inference_buckets`, and puts each output back in input order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import numpy as np
import tqdm
from absl import logging
from jax.experimental import multihost_utils

from bert_jax import xla_flags
from bert_jax.data import batching
from bert_jax.data.sentence_features import encode_texts
from bert_jax.parallel import sharding
from bert_jax.paths import as_path

PROGRESS_MIN_BATCHES = 20  # a progress bar from this many batches on (`progress=None`)
INPUT_COLUMNS = ("input_ids", "token_type_ids", "attention_mask")
MAX_SEGMENTS = 16  # texts a packed row holds at most (the embedding job's embed.max_segments)
ROW_TOKENS = 32  # short texts share packed rows of this many tokens (`row_groups`)


@functools.cache
def _with_options(step, static_argnames: tuple[str, ...], options: tuple) -> Callable:
    options = dict(options)
    return jax.jit(step.__wrapped__, static_argnames=static_argnames, compiler_options=options)


def tuned(step, static_argnames: tuple[str, ...]) -> Callable:
    """The jitted inference `step` compiled with this machine's inference options
    (`xla_flags.inference_options`: per CPU family, on the CPU), else `step` itself; one jitted
    function per step and options, so each shape still compiles once a process."""
    options = xla_flags.inference_options(jax.default_backend())
    if not options:
        return step
    return _with_options(step, static_argnames, tuple(sorted(options.items())))


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
    raw = as_path(path).read_bytes()  # a local file or a URL (gs://...), as every input
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


def run_texts(
    step_fn,
    params,
    tokenizer,
    texts: Sequence[str],
    texts_b: Sequence[str] | None,
    *,
    max_seq_length: int,
    batch_size: int,
    bucket_lengths: bool,
    pack: bool,
    progress: bool | None,
    desc: str,
) -> np.ndarray:
    """`run_batched` over the `features` of `texts` (pairs with `texts_b`): [N, ...].

    Args:
      step_fn, params: as in `run_batched`.
      tokenizer: the model's tokenizer; texts (and texts_b): N texts.
      max_seq_length: tokens kept per text (the caller caps it at the model's positions).
      batch_size: texts per batch.
      bucket_lengths: pad each batch to the next of `inference_buckets(max_seq_length)`; False
        pads every batch to max_seq_length.
      pack: several texts to a row (`MAX_SEGMENTS` a row at most).
      progress: show a progress bar; None: when there are enough batches.
      desc: the progress bar's label.
    """
    return run_batched(
        step_fn,
        params,
        features(tokenizer, texts, texts_b, max_seq_length),
        batch_size=batch_size,
        buckets=inference_buckets(max_seq_length) if bucket_lengths else None,
        progress=progress,
        desc=desc,
        max_segments=MAX_SEGMENTS if pack else 0,
    )


def warn_beyond_positions(max_seq_length: int | None, config) -> None:
    """Logs a warning where a max_seq_length the user gave is beyond the model's positions
    (`config.max_sequence_length`), at which the texts are then cut instead."""
    if max_seq_length is not None and max_seq_length > config.max_sequence_length:
        logging.warning(
            "max_seq_length=%d is beyond the model's %d positions: texts are cut at %d",
            max_seq_length,
            config.max_sequence_length,
            config.max_sequence_length,
        )


class TextBatching(NamedTuple):
    """How a model's texts are batched: the batching keywords `encoder.embed` and
    `heads.predict` take (as `run_texts` takes them), run by `run`."""

    max_seq_length: int
    batch_size: int
    bucket_lengths: bool
    pack: bool
    progress: bool | None

    def run(self, config, step_fn, params, tokenizer, texts, texts_b, desc: str) -> np.ndarray:
        """`run_texts` of a model of `config`, max_seq_length capped at its positions
        (`config.max_sequence_length`)."""
        return run_texts(
            step_fn,
            params,
            tokenizer,
            texts,
            texts_b,
            max_seq_length=min(self.max_seq_length, config.max_sequence_length),
            batch_size=self.batch_size,
            bucket_lengths=self.bucket_lengths,
            pack=self.pack,
            progress=self.progress,
            desc=desc,
        )


def inference_buckets(max_seq_length: int) -> tuple[int, ...]:
    """Token-axis sizes a batch is padded to: every 8 tokens up to 64, then every 32.

    Batches hold rows of similar length (grouped by bucket), and most sentences are short, so the
    fine steps at the start save most of the padding; each size compiles once per process.
    """
    fine = {b for b in range(8, 64, 8) if b < max_seq_length}
    return tuple(sorted(fine | set(batching.length_buckets(max_seq_length))))


def pack_texts(
    encoded: dict[str, np.ndarray], max_segments: int, row_length: int
) -> tuple[dict[str, np.ndarray], batching.PackingInfo]:
    """The texts of `features` packed several to a row of `row_length` tokens (`batching.pack`,
    best-fit decreasing; every text at most `row_length` tokens).

    Returns:
      (input_ids, token_type_ids, attention_mask, segment_ids, position_ids int32 [R, L];
      cls_positions int32 and example_weights float32 [R, S], where each text went).
    """
    texts = {k: encoded[k][:, :row_length] for k in INPUT_COLUMNS}
    texts["example_weights"] = encoded["example_weights"]
    texts["labels"] = np.zeros(len(texts["input_ids"]), np.int32)
    packed, info = batching.pack(texts, max_segments=max_segments, max_seq_length=row_length)
    packed.pop("labels")
    return packed, info


def row_groups(
    lengths: np.ndarray, buckets: Sequence[int], min_texts: int = 1
) -> dict[int, np.ndarray]:
    """{row length: the texts packed into rows of it}: texts of at most ROW_TOKENS tokens share
    rows of ROW_TOKENS; a longer text gets rows of its bucket (the next of `buckets`), and
    shares one only with texts that fill the rest. A length that fewer than `min_texts` texts
    would get is dropped (`busy_buckets`): they go to the next longer one."""
    bounds = busy_buckets(lengths, {ROW_TOKENS, *(b for b in buckets if b > ROW_TOKENS)}, min_texts)
    rows = bounds[np.searchsorted(bounds, lengths, side="left")]
    return {int(r): np.flatnonzero(rows == r) for r in np.unique(rows)}


def busy_buckets(lengths: np.ndarray, buckets: Sequence[int], min_texts: int) -> np.ndarray:
    """The sizes of `buckets` (one at least max(lengths)) worth a compile: from the shortest
    up, a size is kept once at least `min_texts` texts of `lengths` would be padded to it,
    counting those of the sizes dropped below it; the size of the longest text is always kept,
    those above it never.

    Each size is one more program to trace and compile (about a second for a small model on a
    CPU), worth it only when the texts it saves padding for fill a batch; a large input keeps
    every size its texts use. Returns int [K], K <= len(buckets)."""
    bounds = np.array(sorted(buckets))
    bounds = bounds[: np.searchsorted(bounds, lengths.max(), side="left") + 1]
    counts = np.bincount(np.searchsorted(bounds, lengths, side="left"), minlength=len(bounds))
    kept, waiting = [], 0
    for bound, count in zip(bounds[:-1], counts[:-1]):
        waiting += count
        if waiting >= min_texts:
            kept.append(bound)
            waiting = 0
    return np.array([*kept, bounds[-1]])


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def _power_of_two(x: int) -> int:
    """The least power of two >= x (x >= 1)."""
    return 1 << (x - 1).bit_length()


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
    max_segments: int = 0,
    row_multiple: int = 1,
    per_token: bool = False,
) -> np.ndarray:
    """`step_fn(params, batch)`'s outputs over batches of the `features`, in input order: [N, ...].

    Packed (`max_segments` > 0): the texts go several to a row (`pack_texts`), short texts into
    rows of ROW_TOKENS, longer ones into rows of their bucket (`row_groups`: short rows, since
    attention over a row costs its length per token); a batch is the rows of about `batch_size`
    texts of one row length (a power of two, then a multiple of `row_multiple`). `step_fn` takes
    the packed keys and returns [R, S, ...], one output a slot, or with `per_token` [R, L, ...],
    one a token (then [N, L0, ...] come back, L0 the features' width, each text's tokens from
    position 0).

    Else one text a row: `step_fn` takes input_ids, token_type_ids, attention_mask [B, L] and
    returns [B, ...]; rows are grouped by length bucket (each batch padded to its bucket);
    `buckets=None` pads every batch to the features' full length. `group_by_length=False` keeps
    the rows' order (rows already sorted by length make batches of neighbours, each cut to its
    bucket).

    The parameters go to the device once and enter every call as arguments, so each shape
    compiles one program, whatever the parameters hold. The last batch is filled up to the
    others' size (packed: of its part, up to a power of two of rows).
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    n = batching.num_rows(encoded)
    if n == 0:
        raise ValueError("no texts to run")
    # Host arrays go to the device once; placed ones (a mesh's, perhaps over many processes) stay.
    params = jax.tree.map(lambda x: x if isinstance(x, jax.Array) else jax.device_put(x), params)
    inputs = {k: encoded[k] for k in (*INPUT_COLUMNS, "example_weights")}
    if max_segments:
        parts = _packed_parts(inputs, batch_size, buckets, max_segments, row_multiple)
        buckets, group_by_length = None, False  # each part's rows are of one length
    else:
        parts = [_Part(np.arange(n), inputs, None, batch_size)]
        buckets = _busy_widths(inputs, buckets, batch_size)
        if group_by_length is None:
            group_by_length = buckets is not None  # similar lengths together: little padding
    total = sum(batching.num_batches(batching.num_rows(p.features), p.rows) for p in parts)
    show = total >= PROGRESS_MIN_BATCHES if progress is None else progress
    bar = tqdm.tqdm(total=n, disable=not show, desc=desc, unit="text")
    outputs = [[] for _ in parts]
    indices = [[] for _ in parts]
    pending = None
    for which, part in enumerate(parts):
        for batch, idx in batching.batches(
            part.features,
            part.rows,
            bucket_boundaries=buckets,
            group_by_length=group_by_length,
            return_indices=True,
        ):
            if part.info is not None:  # a part's last batch: a power of two of rows, not all
                keep = _round_up(_power_of_two(int(np.sum(idx >= 0))), row_multiple)
                keep = min(part.rows, keep)
                batch, idx = {k: v[:keep] for k, v in batch.items()}, idx[:keep]
            texts = int(np.sum(batch.pop("example_weights") > 0))
            out = step_fn(params, batch)  # dispatched asynchronously: the next is cut meanwhile
            if pending is not None:
                outputs[pending[2]].append(np.asarray(pending[0]))
                bar.update(pending[1])
            pending = (out, texts, which)
            indices[which].append(idx)
    outputs[pending[2]].append(np.asarray(pending[0]))
    bar.update(pending[1])
    bar.close()
    width = inputs["input_ids"].shape[1] if per_token else None
    return _in_input_order(parts, outputs, indices, n, width)


def _busy_widths(
    inputs: dict[str, np.ndarray], buckets: Sequence[int] | None, batch_size: int
) -> tuple[int, ...] | None:
    """The `busy_buckets` of one text a row's `buckets` (None: None): the widths that at least
    a batch's worth of texts is padded to, the features' own width a candidate too."""
    if buckets is None:
        return None
    width = inputs["input_ids"].shape[-1]
    return tuple(busy_buckets(batching.row_lengths(inputs), {*buckets, width}, batch_size))


class _Part(NamedTuple):
    """Texts that `run_batched` batches together: which (indices [T]), their features (one text
    a row, or packed), the packing (`batching.PackingInfo`, or None) and the rows a batch holds."""

    texts: np.ndarray
    features: dict[str, np.ndarray]
    info: batching.PackingInfo | None
    rows: int


def _packed_parts(
    inputs: dict[str, np.ndarray],
    batch_size: int,
    buckets: Sequence[int] | None,
    max_segments: int,
    row_multiple: int,
) -> list[_Part]:
    """The texts packed into rows of each length of `row_groups`, one part a length, each
    batch the rows of about `batch_size` texts (a power of two, then a multiple of
    `row_multiple`)."""
    width = inputs["input_ids"].shape[1]
    lengths = batching.row_lengths(inputs)
    parts = []
    for row_length, texts in row_groups(lengths, buckets or (width,), batch_size).items():
        packed, info = pack_texts(
            {k: v[texts] for k, v in inputs.items()}, max_segments, min(row_length, width)
        )
        # The rows of about batch_size texts, a power of two (at most batch_size): few shapes
        # however densely a call's texts pack (bulk inference calls once a chunk).
        rows = min(_power_of_two(-(-batch_size * info.num_rows // len(texts))), batch_size)
        parts.append(_Part(texts, packed, info, _round_up(rows, row_multiple)))
    return parts


def _in_input_order(
    parts: Sequence[_Part], outputs: list, indices: list, n: int, width: int | None
) -> np.ndarray:
    """Each part's batch outputs put back in input order, unpacked: [n, ...] (per token, with
    `width` the features' length: [n, width, ...])."""
    result = None
    for part, outs, idx in zip(parts, outputs, indices):
        out = batching.unbatch(outs, idx, batching.num_rows(part.features))
        if part.info is not None and width is not None:
            out = batching.unpack_tokens(out, part.info, width=width)
        elif part.info is not None:
            out = batching.unpack_examples(out, part.info)
        if result is None:
            result = np.zeros((n, *out.shape[1:]), out.dtype)
        result[part.texts] = out
    return result


def run_on_mesh(
    mesh,
    apply_fn,
    params,
    features: dict[str, np.ndarray],
    batch_size: int,
    setting: str,
    *,
    max_segments: int = 0,
    per_token: bool = False,
) -> np.ndarray:
    """`apply_fn(params, global batch)`'s outputs [N, ...] for feature rows [N, L] over every
    data-parallel device and host of `mesh` (each host feeds its rows of each batch; the outputs
    are gathered): `run_batched`'s batches, packed with `max_segments` > 0 (rows a multiple of
    the data-parallel devices) or of similar lengths. `setting` names the batch size where it
    does not split over the data-parallel devices."""
    shards = sharding.data_parallel_size(mesh)
    if batch_size % shards:
        raise ValueError(
            f"{setting}={batch_size} does not split over the {shards} data-parallel devices"
        )

    def apply(params, batch):
        rows = sharding.host_batch_rows(mesh, len(batch["input_ids"]))
        local = {k: v[rows] for k, v in batch.items()}
        out = apply_fn(params, sharding.global_batch_from_local(local, mesh))
        return jax.device_get(multihost_utils.process_allgather(out, tiled=True))

    with jax.set_mesh(mesh):
        return run_batched(
            apply,
            params,
            features,
            batch_size=batch_size,
            buckets=batching.length_buckets(features["input_ids"].shape[-1]),
            progress=False,
            desc=setting,
            max_segments=max_segments,
            row_multiple=shards,
            per_token=per_token,
        )
