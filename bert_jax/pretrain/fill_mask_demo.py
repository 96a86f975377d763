"""What pretraining shows of a model's progress: held-out lines with a whole word masked, and the
model's top guesses there before and after training (`FillMaskDemo`).

The lines come from a held-out pretraining batch (`masked_examples`); the guesses are the masked-LM
head's (`inference.top_predictions`), so the demonstration runs for every model family. Words,
lines and guesses are read through the tokenizer (its continuation pieces, its decoding, its own
mask token), so a byte-level BPE or Unigram vocabulary shows text ("less"), not pieces ("Ġless").
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence

import jax
import numpy as np

from bert_jax import tokenization
from bert_jax.inference import token_text, top_predictions


def masked_examples(batch, tokenizer, num_examples: int = 4, context_tokens: int = 20):
    """Held-out lines with one whole word masked, for showing what a pretrained model learned.

    From a pretraining batch, each row's original tokens (its masks undone) are cut to a window
    of the first segment, and the alphabetic whole word nearest the window's middle is masked.

    Args:
      batch: a host pretraining batch: input_ids, token_type_ids, masked_lm_positions,
        masked_lm_ids, masked_lm_weights ([B, L] and [B, P]).
      tokenizer: the batch's tokenizer (any kind).
      num_examples: N, at most B.
      context_tokens: the window's length in tokens.

    Returns:
      (features {"input_ids", "token_type_ids", "attention_mask"} int32 [N, W + 2],
       positions int32 [N, 1], texts with the tokenizer's mask token [N], answers [N]: the
       masked words as text).
    """
    ids = np.array(batch["input_ids"])
    rows = np.arange(ids.shape[0])[:, None]
    real = np.asarray(batch["masked_lm_weights"]) > 0
    ids[rows.repeat(real.shape[1], 1)[real], np.asarray(batch["masked_lm_positions"])[real]] = (
        np.asarray(batch["masked_lm_ids"])[real]
    )
    special = {tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id, tokenizer.mask_id}
    continues = tokenizer.continuation_mask()
    width = context_tokens + 2
    out_ids, positions, texts, answers = [], [], [], []
    for row, types in zip(ids, np.asarray(batch["token_type_ids"])):
        window = [int(t) for t, s in zip(row, types) if s == 0 and int(t) not in special]
        window = window[:context_tokens]
        # Whole words: a token that starts a word, reads as letters and no piece continues.
        whole = [
            i
            for i, t in enumerate(window)
            if not continues[t]
            and tokenizer.decode([t]).strip().isalpha()
            and (i + 1 == len(window) or not continues[window[i + 1]])
        ]
        if len(window) < 6 or not whole:
            continue
        target = min(whole, key=lambda i: abs(i - len(window) / 2))
        answers.append(tokenizer.decode([window[target]]).strip())
        texts.append(_masked_text(tokenizer, window, target))
        window[target] = tokenizer.mask_id
        row_ids = [tokenizer.cls_id, *window, tokenizer.sep_id]
        out_ids.append(row_ids + [tokenizer.pad_id] * (width - len(row_ids)))
        positions.append([target + 1])
        if len(texts) == num_examples:
            break
    if not texts:
        raise ValueError("the batch holds no line with a whole word to mask")
    input_ids = np.array(out_ids, np.int32)
    features = {
        "input_ids": input_ids,
        "token_type_ids": np.zeros_like(input_ids),
        "attention_mask": (input_ids != tokenizer.pad_id).astype(np.int32),
    }
    return features, np.array(positions, np.int32), texts, answers


def _masked_text(tokenizer, ids: Sequence[int], target: int) -> str:
    """The text of `ids` with the tokenizer's mask token in place of token `target`."""
    before = tokenizer.decode(ids[:target]).strip()
    after = tokenizer.decode(ids[target + 1 :]).strip()
    return " ".join(part for part in (before, tokenizer.mask_token, after) if part)


def format_predictions(texts, answers, columns, id_to_token) -> str:
    """Masked lines, each with every column's top predictions and their probabilities.

    Args:
      texts: N lines with the mask token; answers: N masked words (or None).
      columns: (title, ids [N, 1, K], probs [N, 1, K]) per column, e.g. before and after training.
      id_to_token: token id -> the string shown (`FillMaskDemo` shows `inference.token_text`).
    """
    lines = []
    for i, text in enumerate(texts):
        lines.append(f"  {text}" + (f"   (masked: {answers[i]})" if answers else ""))
        for title, ids, probs in columns:
            guesses = ", ".join(f"{id_to_token(t)} {p:.2f}" for t, p in zip(ids[i, 0], probs[i, 0]))
            lines.append(f"    {title}: {guesses}")
    return "\n".join(lines)


@dataclasses.dataclass
class FillMaskDemo:
    """Held-out lines with a whole word masked, and a model's top guesses there at chosen steps
    (the pretraining job shows them before and after training).

    Attributes:
      features: {"input_ids", "token_type_ids", "attention_mask"} int32 [N, W + 2].
      positions: int32 [N, 1], each line's masked position.
      texts: the N lines, the tokenizer's mask token in place of the word.
      answers: the N masked words.
      tokenizer: the lines' tokenizer (any kind).
      columns: (title, token ids int32 [N, 1, K], probabilities float32 [N, 1, K]), one per
        `predict` call, in order.
    """

    features: dict[str, np.ndarray]
    positions: np.ndarray
    texts: list[str]
    answers: list[str]
    tokenizer: tokenization.SubwordTokenizer
    columns: list[tuple[str, np.ndarray, np.ndarray]] = dataclasses.field(default_factory=list)

    def predict(self, model, params, label: str) -> None:
        """Adds a column titled `label`: the top guesses of `model` (an MLM head) under `params`."""
        self.columns.append((label, *top_predictions(model, params, self.features, self.positions)))

    def format(self) -> str:
        """A title line, then each line with every column's guesses (`format_predictions`)."""
        rows = format_predictions(
            self.texts, self.answers, self.columns, functools.partial(token_text, self.tokenizer)
        )
        return "Held-out lines with a word masked, and the model's top guesses:\n" + rows


def fill_mask_demo(batch, tokenizer_path: str | None, num_examples: int = 4) -> FillMaskDemo | None:
    """Held-out lines of a pretraining batch to show a model's guesses on (`masked_examples`).

    Args:
      batch: a host pretraining batch (input_ids, token_type_ids [B, L]; masked_lm_positions,
        masked_lm_ids, masked_lm_weights [B, P]).
      tokenizer_path: the batch's vocabulary file (vocab.txt or tokenizer.json), or None.
      num_examples: N, the lines to show (at most B).

    Returns:
      The demonstration, no column predicted yet; None where it cannot run: no tokenizer file at
      `tokenizer_path`, or several processes.
    """
    if not (tokenizer_path and os.path.isfile(tokenizer_path)):
        return None
    if jax.process_count() > 1:  # the host-side demonstration needs every parameter on one host
        return None
    tokenizer = tokenization.load_tokenizer(tokenizer_path)
    return FillMaskDemo(*masked_examples(batch, tokenizer, num_examples), tokenizer)
