"""The registry of fine-tuning tasks: name -> `FinetuneTask`. A new task is one line here."""

from __future__ import annotations

from bert_jax.finetune import custom, glue, ner, shakespeare, squad, swag
from bert_jax.finetune.task import FinetuneTask

TASKS: dict[str, FinetuneTask] = {
    t.name: t
    for t in (
        *glue.TASKS,
        squad.SQUAD1,
        squad.SQUAD2,
        ner.TASK,
        swag.TASK,
        custom.TASK,
        shakespeare.TASK,
    )
}


def get_task(name: str) -> FinetuneTask:
    """The registered task called `name`; ValueError naming the known ones otherwise."""
    if name not in TASKS:
        raise ValueError(f"unknown fine-tuning task {name!r}; known: {sorted(TASKS)}")
    return TASKS[name]
