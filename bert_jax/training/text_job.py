"""The settings every text job's block shares, as one typed record parsed once.

    block = TextJob.parse(config, "embed")    # the job's check, before any data is read
    block.seeds, block.num_epochs, block.max_seq_length, block.pack, block.max_segments

The fine-tuning, embedding and reranking jobs each have a config block (`finetune`, `embed`,
`rerank`) holding these keys beside their own; `configs/common.py:text_job_block` writes them
with each file's defaults, so users spell them as before (`--config.embed.max_seq_length=64`).
The job's check parses its block here once, refusing a wrong value by its full key, and hands
the record, not the config, to what trains its batches (`retrieval.packing.train_batches`,
`seed_run`), so those read no job's keys.
"""

from __future__ import annotations

import dataclasses

from bert_jax.training import settings


def whole_number(block, key: str, field: str, least: int) -> int:
    """`block[field]`, an integer >= `least` (not a bool), else ValueError naming
    `config.<key>.<field>`."""
    value = block[field]
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"config.{key}.{field}={value!r}: expected an integer >= {least}")
    return value


@dataclasses.dataclass(frozen=True)
class TextJob:
    """A text job's shared settings.

    Attributes:
      key: the block's config key ("finetune", "embed", "rerank").
      seeds: the seeds trained, in order (each its own run; results as mean +- std).
      num_epochs: epochs over the training rows (>= 1).
      max_seq_length: tokens a row (a text, a pair, an example) keeps; 0 where the job takes its
        starting checkpoint's or its own default.
      pack: whether several rows go to one row of max_seq_length tokens.
      max_segments: rows a packed row holds at most (>= 1).
      eval_batch_size: rows a step when scoring the dev set (>= 1).
    """

    key: str
    seeds: tuple[int, ...]
    num_epochs: int
    max_seq_length: int
    pack: bool
    max_segments: int
    eval_batch_size: int

    @classmethod
    def parse(cls, config, key: str, *, least_length: int = 0) -> TextJob:
        """The block `config[key]`'s shared settings; `least_length`: the least max_seq_length.

        Raises:
          ValueError: a count that is no whole number or below its least, a pack that is no
            boolean, a bad seed list; naming the key (`config.embed.num_epochs=0: ...`).
        """
        block = config[key]
        if block.pack not in (True, False, 0, 1):
            raise ValueError(f"{key}.pack={block.pack!r}; expected true or false (1 or 0)")
        return cls(
            key=key,
            seeds=tuple(settings.parse_seeds(block.seeds, f"{key}.seeds")),
            num_epochs=whole_number(block, key, "num_epochs", 1),
            max_seq_length=whole_number(block, key, "max_seq_length", least_length),
            pack=bool(block.pack),
            max_segments=whole_number(block, key, "max_segments", 1),
            eval_batch_size=whole_number(block, key, "eval_batch_size", 1),
        )
