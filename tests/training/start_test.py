"""Starting states (`bert_jax.training.start`): a training run's parameters read into their shardings,
or through the host conversion for another head."""

from bert_jax.training import experiment
from tests.common import load_config_file


def _tiny_pretraining_config(mesh):
    config = load_config_file("pretrain.py").get_config("size=tiny")
    config.model.update(
        vocab_size=99,
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=16,
    )
    config.mesh.update(data=mesh[0], fsdp=mesh[1], tensor=mesh[2])
    return config


def _experiment(mesh, model_name="BertForPreTraining"):
    from bert_jax.models.bert.config import BertConfig

    config = _tiny_pretraining_config(mesh)
    task = "pretraining" if model_name == "BertForPreTraining" else "mlm"
    model_config = BertConfig(**config.model.to_dict())
    return experiment.Experiment.build(config, model_config, model_name, task, 10)


def test_init_from_a_training_run_reads_the_parameters_into_their_shardings(tmp_path, monkeypatch):
    """Written on one mesh, read on another: every parameter arrives with the new mesh's
    sharding and the written values, the optimizer state is fresh, and nothing goes through the
    host conversion (`detect.load_any`, `run_params.load_training_checkpoint`)."""
    import jax
    import numpy as np
    from flax import traverse_util

    from bert_jax.checkpoints import checkpointing, detect, pretrained, run_params
    from bert_jax.training import start

    source = _experiment((8, 1, 1))
    state = start.init_state(source, seed=3)
    ckpt = checkpointing.Checkpointer(str(tmp_path / "run" / "checkpoints"), async_save=False)
    meta = source.checkpoint_meta()
    ckpt.save(5, state, meta={**meta, "step": 5})
    ckpt.close()
    # The config alone (fine-tuning's random_init and --mode=compile): the checkpoint's record.
    assert pretrained.read_config(tmp_path / "run") == source.model_config

    def no_host_path(*args, **kwargs):
        raise AssertionError("init_from went through the host conversion")

    target = _experiment((2, 2, 2))
    monkeypatch.setattr(detect, "load_any", no_host_path)
    monkeypatch.setattr(run_params, "load_training_checkpoint", no_host_path)
    fresh = checkpointing.Checkpointer(str(tmp_path / "new" / "checkpoints"))
    begun = start.starting_state(target, fresh, init_from=str(tmp_path / "run"))
    fresh.close()
    got = begun.state
    assert (begun.step, begun.source) == (0, "init_from")
    want = jax.tree_util.tree_leaves_with_path(jax.device_get(state.params))
    for (path, value), array, sh in zip(
        want,
        jax.tree_util.tree_leaves(got.params),
        jax.tree_util.tree_leaves(target.state_shardings.params),
    ):
        assert array.sharding == sh, path
        np.testing.assert_array_equal(np.asarray(array), value, err_msg=str(path))
    mu = [x for x in jax.tree_util.tree_leaves(got.opt_state) if np.ndim(x) > 0]
    assert mu and all(not np.any(np.asarray(x)) for x in mu)  # fresh moments: zeros

    # Another head: the parameters go through the host conversion, which maps them by name.
    monkeypatch.undo()
    called = []
    real = run_params.load_training_checkpoint
    monkeypatch.setattr(
        run_params, "load_training_checkpoint", lambda *a, **k: called.append(a) or real(*a, **k)
    )
    mlm = _experiment((8, 1, 1), "BertForMaskedLM")
    fresh = checkpointing.Checkpointer(str(tmp_path / "mlm" / "checkpoints"))
    begun = start.starting_state(mlm, fresh, init_from=str(tmp_path / "run"))
    fresh.close()
    assert len(called) == 1 and begun.source == "init_from"
    source_params, got = jax.device_get(state.params), jax.device_get(begun.state.params)
    want, have = (dict(traverse_util.flatten_dict(p, sep="/")) for p in (source_params, got))
    mapped = [k for k in have if k.startswith(("bert/", "cls/predictions/"))]
    assert mapped and set(mapped) <= set(want)
    for key in mapped:  # the vocabulary's 99 rows (the rest pad it to a multiple)
        np.testing.assert_array_equal(have[key][:99], want[key][:99], err_msg=key)


def test_init_from_a_hub_id_reads_the_cached_snapshot(tmp_path, monkeypatch):
    """`init_from=org/name` (HF_HUB_OFFLINE=1): the Hugging Face cache's snapshot, converted on
    the host into the run's shardings."""
    import jax
    import numpy as np

    from bert_jax import convert
    from bert_jax.checkpoints import checkpointing
    from bert_jax.training import start

    source = _experiment((8, 1, 1))
    params = jax.device_get(start.init_state(source, seed=3).params)
    commit = "89abcdef" * 5
    repo = tmp_path / "cache" / "models--org--tiny"
    convert.save_pytorch(source.model_config, params, repo / "snapshots" / commit, source.head)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)

    target = _experiment((2, 2, 2))
    fresh = checkpointing.Checkpointer(str(tmp_path / "new" / "checkpoints"))
    begun = start.starting_state(target, fresh, init_from="org/tiny")
    fresh.close()
    assert (begun.step, begun.source) == (0, "init_from")
    got = jax.tree_util.tree_leaves_with_path(begun.state.params)
    for (path, array), want, sh in zip(
        got,
        jax.tree_util.tree_leaves(params),
        jax.tree_util.tree_leaves(target.state_shardings.params),
    ):
        assert array.sharding == sh, path
        # The vocabulary's 99 rows (the file's; the rest pad them to a multiple, zero).
        np.testing.assert_array_equal(np.asarray(array)[:99], want[:99], err_msg=str(path))


def test_a_finished_run_starts_others_from_the_model_it_wrote(tmp_path):
    """`pretrained.resolve`: a run whose training is over (no checkpoints/ or export/ left) is
    its hf/, the embedding and reranker jobs' export; a run still holding checkpoints, one with
    an export/, another directory and a file are themselves; a finished run of several seeds
    fails naming the seeds' directories."""
    import pytest

    from bert_jax.checkpoints import pretrained

    def run(name, *folders):
        for folder in folders:
            (tmp_path / name / folder).mkdir(parents=True)
        return str(tmp_path / name)

    finished = run("finished", "hf", "tensorboard")
    assert pretrained.resolve(finished) == str(tmp_path / "finished" / "hf")
    for kept in (run("training", "checkpoints", "hf"), run("finetuned", "export", "hf")):
        assert pretrained.resolve(kept) == kept
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    assert pretrained.resolve(tmp_path / "model") == str(tmp_path / "model")
    assert pretrained.resolve(tmp_path / "model" / "config.json") == str(
        tmp_path / "model" / "config.json"
    )
    seeds = run("seeds", "seed_0/hf", "seed_1/hf", "seed_1/tensorboard")
    with pytest.raises(ValueError, match=r"run of 2 seeds, one model each: name one of .*seed_1$"):
        pretrained.resolve(seeds)
