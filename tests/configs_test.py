"""Every config file loads, in every variant, and builds its model (shapes only)."""

import jax
import pytest

from bert_jax.models.bert.config import BertConfig
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.families import family_of, get_model_class
from bert_jax.models.params import count_params, init_params
from bert_jax.training import objectives
from tests.common import CONFIGS, load_config_file

VARIANTS = {
    "pretrain.py": [
        "size=tiny",
        "size=base,phase=1",
        "size=large,phase=2",
        "size=L4-H512,mlm_only=1",
        "size=large,phase=2,tpu=v5e-16",
        "size=large,phase=1,gpu=h100",
    ],
    "finetune.py": [
        "task=mrpc",
        "task=stsb",
        "task=squad2",
        "task=conll2003",
        "task=swag",
        "task=custom",
        "task=shakespeare,init=minilm,pack=1",
    ],
    "embed.py": ["size=tiny", "init=minilm"],
    "rerank.py": ["size=tiny", "init=minilm"],
}
FINETUNE_HEADS = {
    "mrpc": "BertForSequenceClassification",
    "stsb": "BertForSequenceClassification",
    "squad2": "BertForQuestionAnswering",
    "conll2003": "BertForTokenClassification",
    "swag": "BertForMultipleChoice",
    "custom": "BertForSequenceClassification",
    "shakespeare": "BertForSequenceClassification",
}


def test_every_config_file_is_covered():
    configs = [p.name for p in CONFIGS.glob("*.py") if p.name != "common.py"]  # the shared parser
    assert sorted(configs) == sorted(VARIANTS)


@pytest.mark.parametrize("name, variant", [(n, v) for n, vs in VARIANTS.items() for v in vs])
def test_config_builds_its_model(name, variant):
    config = load_config_file(name).get_config(variant)
    fields = config.model.to_dict()
    fields["vocab_size"] = fields["vocab_size"] or 30522  # fine-tuning: 0 = the tokenizer's
    cfg = BertConfig(**fields)
    runtime = RuntimeConfig(**config.runtime.to_dict()).resolved("cpu")
    if config.job == "finetune":
        head = FINETUNE_HEADS[config.finetune.name]
        assert (config.init_from != "") == ("init=minilm" in variant)
    elif config.job == "embed":
        head = "BertModel"
        assert (config.init_from != "") == ("init=minilm" in variant)
    elif config.job == "rerank":
        head = "BertForSequenceClassification"
        assert (config.init_from != "") == ("init=minilm" in variant)
    else:
        head = family_of(cfg).head_for(objectives.get_objective(config.job).role)
    model = get_model_class(head)(cfg, runtime)
    params = jax.eval_shape(lambda: init_params(model, jax.random.PRNGKey(0)))
    assert count_params(params) > 0
    data = config[config.job] if config.job in ("finetune", "embed", "rerank") else config.data
    assert data.max_seq_length <= cfg.max_position_embeddings
    assert config.global_batch_size % config.num_microbatches == 0


def test_locked_configs_reject_unknown_keys_and_bad_variants():
    module = load_config_file("pretrain.py")
    config = module.get_config("size=tiny")
    with pytest.raises(AttributeError, match="num_train_stepz"):
        config.num_train_stepz = 3
    with pytest.raises(TypeError):
        config.global_batch_size = "many"
    with pytest.raises(ValueError, match="unknown variant key"):
        module.get_config("sise=tiny")
    with pytest.raises(ValueError, match="phase"):
        module.get_config("size=tiny,phase=3")
    with pytest.raises(ValueError, match="unknown TPU slice tpu='v5e-7'"):
        module.get_config("size=large,tpu=v5e-7")
    recipe = module.get_config("size=large,phase=2,tpu=v4-32")
    assert recipe.topology == "v4:2x2x4" and recipe.mesh.fsdp == -1 and recipe.mesh.data == 1
    for name in ("finetune.py", "embed.py", "rerank.py"):  # init= names a known starting point
        with pytest.raises(ValueError, match=r"init='nosuchmodel': expected init=minilm"):
            load_config_file(name).get_config("init=nosuchmodel")


def test_tpu_phase1_batches_take_the_original_tokens_per_slice():
    """Phase 1's global batch is the slice's (rows a chip), the tokens stay 512 x 900k, and the
    learning rate scales by sqrt(batch / 512): 1,024 keeps its 450k steps, 10k warmup, 1.4e-4."""
    module = load_config_file("pretrain.py")
    assert module.tpu_phase1_schedule(1024) == (450_000, 10_000, 1.4e-4)
    for tpu, (topology, batch, _) in module.TPU_RECIPES.items():
        c = module.get_config(f"size=large,phase=1,tpu={tpu}")
        assert c.global_batch_size == batch and c.topology == topology
        assert c.global_batch_size * c.num_train_steps == 512 * 900_000
        assert c.optimizer.peak_learning_rate == pytest.approx(
            1e-4 * (batch / 512) ** 0.5, rel=0.03
        )
    assert module.tpu_phase1_schedule(1536) == (300_000, 6667, 1.7e-4)
    assert module.get_config("size=large,phase=2,tpu=v5e-16").global_batch_size == 512


def test_a_config_that_does_not_fit_a_slice_is_told_the_recipe_that_does():
    """train.py --mode=compile's message when the step does not fit (`fit_hint`): the recipes of
    that slice for the config's model and length, else all of that slice's, else the slices."""
    module = load_config_file("pretrain.py")
    hint = module.fit_hint(module.get_config("size=large,phase=2"), "v5e:4x4")
    assert hint.startswith("the shipped recipe for v5e:4x4: ")
    assert "--config=configs/pretrain.py:size=large,phase=2,tpu=v5e-16 (" in hint
    assert "phase=1" not in hint and "modernbert" not in hint
    hint = module.fit_hint(module.get_config("size=large,phase=1,arch=modernbert"), "v5p:2x2x1")
    assert "size=large,phase=1,tpu=v5p-8,arch=modernbert (" in hint and "phase=2" not in hint
    # No recipe of its model: every recipe of the slice.
    hint = module.fit_hint(module.get_config("size=base,phase=1"), "v5e:8x8")
    assert "size=large,phase=1,tpu=v5e-64; " in hint and "size=large,phase=2,tpu=v5e-64 (" in hint
    hint = module.fit_hint(module.get_config("size=large,phase=2"), "v5e:2x2")
    assert hint.startswith("configs/pretrain.py ships no recipe for v5e:2x2; it has recipes for ")
    assert "tpu=v5e-16 (v5e:4x4)" in hint and "tpu=v5p-128 (v5p:4x4x4)" in hint
    assert module.recipes_on_topology("v4:2x2x4") == [
        "size=large,phase=1,tpu=v4-32",
        "size=large,phase=2,tpu=v4-32",
    ]


def test_variant_values_take_the_type_of_their_default():
    common = load_config_file("common.py")
    defaults = {"size": "tiny", "phase": 1, "lr": 1e-4, "mlm_only": False}
    assert common.parse_variant(None, defaults) == defaults
    assert common.parse_variant("size=base, phase=2,lr=3e-5", defaults) == {
        "size": "base",
        "phase": 2,
        "lr": 3e-5,
        "mlm_only": False,
    }
    for text, value in [("1", True), ("True", True), ("YES", True), ("0", False), ("no", False)]:
        assert common.parse_variant(f"mlm_only={text}", defaults)["mlm_only"] is value
    for variant, message in [
        ("mlm_only=2", "variant mlm_only='2': expected a boolean"),
        ("phase=two", "variant phase='two': expected an integer"),
        ("lr=fast", "variant lr='fast': expected a number"),
        ("sise=tiny", r"unknown variant key\(s\) \['sise'\]; use size=, phase=, lr=, mlm_only="),
    ]:
        with pytest.raises(ValueError, match=message):
            common.parse_variant(variant, defaults)
    # Both config files read booleans alike.
    pretrain, finetune = load_config_file("pretrain.py"), load_config_file("finetune.py")
    assert pretrain.get_config("mlm_only=True").job == "mlm"
    assert finetune.get_config("task=mrpc,pack=True").finetune.pack is True


def test_every_gpu_pretraining_recipe_builds_as_its_compile_row():
    """gpu=CARD gives the card's topology and the remat and micro-batches its compiled row has
    (benchmarks/gpu_pretraining.py), layers unrolled; what has no recipe is refused by name."""
    module = load_config_file("pretrain.py")
    for card, recipes in module.GPU_RECIPES.items():
        for (size, phase), (remat, micro) in recipes.items():
            c = module.get_config(f"size={size},phase={phase},gpu={card}")
            assert (c.topology, c.runtime.remat_policy, c.num_microbatches) == (
                f"gpu:{card}",
                remat,
                micro,
            )
            assert not c.runtime.scan_layers and c.global_batch_size % micro == 0
            assert c.model.hidden_size == BertConfig.preset(size).hidden_size
    for variant, message in [
        ("size=large,gpu=a100", "unknown GPU recipe gpu='a100'; known: \\['h100', 'h100x8'\\]"),
        ("size=base,phase=2,gpu=h100", "no recipe for size=base,phase=2 on gpu=h100; known: "),
        ("size=large,gpu=h100,tpu=v5e-16", "name two machines"),
        ("size=base,gpu=h100,arch=modernbert", "the GPU recipes are BERT's"),
    ]:
        with pytest.raises(ValueError, match=message):
            module.get_config(variant)


@pytest.mark.parametrize("job", ["finetune", "embed", "rerank"])
def test_a_bad_seed_list_names_the_jobs_setting(job):
    """Each seeded job's check (its registry entry's) reads its seeds the one way
    (`settings.parse_seeds`), in its own block."""
    from bert_jax.training import job as jobs

    registered = jobs.get(job)
    config = load_config_file(f"{job}.py").get_config("task=custom" if job == "finetune" else "")

    def check(seeds):
        config[registered.block].seeds = seeds
        return registered.check(config, reads_data=False)

    for seeds in ("", "0,x", "1,1", " , "):
        with pytest.raises(ValueError, match=rf"{job}\.seeds=.*distinct whole numbers"):
            check(seeds)
    assert check("2, 0,1").seeds == (2, 0, 1)
