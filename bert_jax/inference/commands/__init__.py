"""The registry of `python -m bert_jax.inference`'s commands: name -> `base.Command`.

Each command is one module here exposing `COMMAND` (its flags, its one-file runner and, for one
that runs over a corpus, its bulk row function); adding one is its module and its line below.
The command line lists them in this order.
"""

from bert_jax.inference.commands import (
    attention,
    embed,
    fill_mask,
    fuse,
    predict,
    rerank,
    search,
)
from bert_jax.inference.commands.base import BulkForm, Command, Rows

COMMANDS: dict[str, Command] = {
    command.name: command
    for command in (
        embed.COMMAND,
        predict.COMMAND,
        rerank.COMMAND,
        attention.COMMAND,
        fill_mask.COMMAND,
        search.COMMAND,
        fuse.COMMAND,
    )
}


def bulk_form(name: str) -> BulkForm:
    """The bulk form of the command `name`; ValueError for a command without one."""
    forms = {n: c.bulk for n, c in COMMANDS.items() if c.bulk is not None}
    if name not in forms:
        raise ValueError(f"command must be one of {tuple(forms)}, got {name!r}")
    return forms[name]


__all__ = ["COMMANDS", "BulkForm", "Command", "Rows", "bulk_form"]
