"""The toy job's config file (`tests/training/toy_job/run.py`): importing the job's module
registers it, so `train.py` runs it with no edit anywhere else.

    python train.py --config=tests/training/toy_job/config.py --workdir=/tmp/toy
"""

import dataclasses

import ml_collections

from bert_jax.models import families
from configs import common
from tests.common import TINY
from tests.training.toy_job import run  # noqa: F401  (registers config.job="toy")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    c = ml_collections.ConfigDict()
    c.job = "toy"
    c.toy = ml_collections.ConfigDict(
        dict(num_examples=8, max_seq_length=7, num_epochs=1, seeds="0")
    )
    # The tests' tiny BERT (odd sizes: vocab 99, hidden 32, heads 4, mlp 37), one layer.
    c.model = families.model_fields(dataclasses.replace(TINY, num_hidden_layers=1, num_labels=2))
    c.runtime = common.runtime(scan_layers=False)
    c.optimizer = common.optimizer(1e-3)
    c.global_batch_size = 4
    c.num_microbatches = 1
    c.seed = 0
    c.mesh = common.mesh()
    c.sharding_rules = common.sharding_rules()
    c.log_every_steps = 2
    c.eval_every_steps = 0
    c.checkpoint_every_steps = 1000
    c.max_checkpoints_to_keep = 1
    c.async_checkpointing = False
    c.init_from = ""
    c.topology = ""
    c.model_card = common.model_card_config()
    c.lock()
    return c
