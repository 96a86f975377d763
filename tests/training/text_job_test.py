"""The settings every text job shares (`training.text_job.TextJob`), parsed once by each job's
check: the same keys, the same refusals naming the key, for the fine-tuning, embedding and
reranking jobs alike (their seed lists: tests/configs_test.py)."""

import dataclasses
import importlib

import ml_collections
import pytest

from bert_jax.training import job
from bert_jax.training.text_job import TextJob

# job name -> (config file's module, its block, the variant that reads no init_from).
TEXT_JOBS = {
    "finetune": ("configs.finetune", "finetune", "task=custom"),
    "embed": ("configs.embed", "embed", "size=tiny"),
    "rerank": ("configs.rerank", "rerank", "size=tiny"),
}


def text_job_config(name):
    module, block, variant = TEXT_JOBS[name]
    config = importlib.import_module(module).get_config(variant)
    config[block].train_file = "train.jsonl"  # not read: the checks come before any data
    return config, block


@pytest.mark.parametrize("name", sorted(TEXT_JOBS))
def test_each_text_job_check_returns_its_block_parsed(name):
    config, block = text_job_config(name)
    config[block].seeds = "2,0"
    config[block].pack = False
    # The check's record: the shared settings, or the job's typed block that extends them.
    parsed = job.get(name).check(config, reads_data=False)
    assert isinstance(parsed, TextJob)
    shared = {f.name: getattr(parsed, f.name) for f in dataclasses.fields(TextJob)}
    assert TextJob(**shared) == TextJob.parse(config, block)
    assert parsed.key == block and parsed.seeds == (2, 0) and parsed.pack is False
    assert parsed.num_epochs == config[block].num_epochs >= 1


@pytest.mark.parametrize("name", sorted(TEXT_JOBS))
@pytest.mark.parametrize(
    "field, value, message",
    [
        ("num_epochs", 0, "config.{b}.num_epochs=0: expected an integer >= 1"),
        ("num_epochs", 1.5, "config.{b}.num_epochs=1.5: expected an integer >= 1"),
        ("max_segments", 0, "config.{b}.max_segments=0: expected an integer >= 1"),
        ("eval_batch_size", True, "config.{b}.eval_batch_size=True: expected an integer >= 1"),
        ("max_seq_length", -1, "config.{b}.max_seq_length=-1: expected an integer >= "),
        ("pack", "yes", "{b}.pack='yes'; expected true or false (1 or 0)"),
    ],
)
def test_each_text_job_refuses_a_bad_shared_setting_by_its_key(name, field, value, message):
    config, block = text_job_config(name)
    # As a config file may write them (the command line's values are typed by their default).
    config = ml_collections.ConfigDict(config.to_dict(), type_safe=False)
    config[block][field] = value
    with pytest.raises(ValueError) as error:
        job.get(name).check(config, reads_data=False)
    assert message.format(b=block) in str(error.value)


def test_fine_tuning_needs_a_length_where_the_others_take_their_default():
    config, _ = text_job_config("finetune")
    config.finetune.max_seq_length = 0
    with pytest.raises(
        ValueError, match=r"config\.finetune\.max_seq_length=0: expected an integer >= 1"
    ):
        job.get("finetune").check(config, reads_data=False)
    for name in ("embed", "rerank"):
        config, block = text_job_config(name)
        config[block].max_seq_length = 0
        assert job.get(name).check(config, reads_data=False).max_seq_length == 0
