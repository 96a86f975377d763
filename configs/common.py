"""What the config files share: the `--config=configs/X.py:key=value,...` variant parser."""

from __future__ import annotations

from collections.abc import Iterable


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
