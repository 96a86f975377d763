"""What the config files share: the `--config=configs/X.py:key=value,...` variant parser."""

from __future__ import annotations

from collections.abc import Iterable

import ml_collections


def parse_variant(arg: str | None, keys: Iterable[str]) -> dict[str, str]:
    """{key: value} of a variant string "key=value,key=value"; ValueError naming any key not in
    `keys` (and the known ones)."""
    out = {}
    for part in (arg or "").split(","):
        if part:
            key, _, value = part.partition("=")
            out[key.strip()] = value.strip()
    keys = tuple(keys)
    unknown = set(out) - set(keys)
    if unknown:
        known = ", ".join(f"{k}=" for k in keys)
        raise ValueError(f"unknown variant key(s) {sorted(unknown)}; use {known}")
    return out


def model_card_config() -> ml_collections.ConfigDict:
    """The `model_card` block: what the README.md of every export (`<workdir>/hf`) says beyond
    the run's own records (bert_jax.model_card)."""
    return ml_collections.ConfigDict(
        dict(
            license="apache-2.0",  # the Hub's license id of the exported weights
            datasets="",  # comma-separated names of the training data (Hub dataset ids)
            language="",  # comma-separated language codes, e.g. "en"
            name="",  # the card's title ("" = the run directory's name)
        )
    )
