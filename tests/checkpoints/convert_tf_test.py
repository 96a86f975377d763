"""Original google-research/bert TF checkpoints, written by TensorFlow itself."""

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

from bert_jax import convert
from bert_jax.checkpoints import detect, hf, table, verify
from bert_jax.checkpoints import tf as tf_checkpoints
from tests.checkpoints.convert_test import hf_model
from tests.common import ODD

# TensorFlow is imported where a test writes a checkpoint, not here: collecting the suite (each
# worker, each stage) would otherwise spend seconds importing it.
if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("could not import 'tensorflow'", allow_module_level=True)
pytestmark = [pytest.mark.tf, pytest.mark.torch]


def original_variables(torch_model, prefix_heads=True):
    """The variables google-research/bert's modeling.py (and run_pretraining.py) create, with
    values from a transformers model. Written independently of bert_jax's table: TF kernels are
    [in, out] (torch Linear weights transposed), embeddings as is, LayerNorm gamma/beta, and the
    heads' `output_weights` stored [out, in]."""
    out = {}
    for key, value in torch_model.state_dict().items():
        v = value.detach().numpy()
        if key.startswith("cls.predictions.decoder") or key.endswith("position_ids"):
            continue
        if key == "cls.predictions.bias":
            out["cls/predictions/output_bias"] = v
            continue
        if key.startswith("cls.seq_relationship."):
            out[
                "cls/seq_relationship/"
                + ("output_weights" if key.endswith("weight") else "output_bias")
            ] = v
            continue
        if key.startswith("classifier."):
            out["output_weights" if key.endswith("weight") else "output_bias"] = v
            continue
        if key.startswith(("embeddings.", "encoder.", "pooler.")):
            key = "bert." + key  # the original always scopes the encoder under bert/
        name = key.replace(".", "/").replace("layer/", "layer_")
        name = name.replace("LayerNorm/weight", "LayerNorm/gamma").replace(
            "LayerNorm/bias", "LayerNorm/beta"
        )
        if name.endswith("_embeddings/weight"):
            name = name[: -len("/weight")]
        elif name.endswith("/weight"):
            name = name[: -len("/weight")] + "/kernel"
            v = v.T
        out[name] = v
    return out


def write_tf_checkpoint(
    variables, folder, with_optimizer_slots=True, name="bert_model.ckpt", global_step=None
):
    """tf.compat.v1 Saver, graph mode: the checkpoint layout of the original run_pretraining.py
    (which saves `model.ckpt-<global_step>` and a `checkpoint` file naming the newest)."""
    import tensorflow as tf

    folder.mkdir(parents=True, exist_ok=True)
    graph = tf.Graph()
    with graph.as_default():
        for key, value in variables.items():
            tf.compat.v1.get_variable(key, initializer=tf.constant(value))
            if with_optimizer_slots:
                tf.compat.v1.get_variable(key + "/adam_m", initializer=tf.zeros_like(value))
                tf.compat.v1.get_variable(key + "/adam_v", initializer=tf.zeros_like(value))
        tf.compat.v1.train.get_or_create_global_step()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            return saver.save(sess, str(folder / name), global_step=global_step)


@pytest.mark.parametrize("head", ["BertForPreTraining", "BertForSequenceClassification"])
def test_load_original_tf_checkpoint(tmp_path, head):
    cfg = ODD.replace(hidden_act="gelu")  # the original's names: gelu / relu
    torch_model = hf_model(cfg, head, seed=7)
    variables = original_variables(torch_model)
    prefix = write_tf_checkpoint(variables, tmp_path / "ckpt")
    cfg.to_json_file(tmp_path / "ckpt" / "bert_config.json", original=True)
    # Loading by prefix and by folder give the same result.
    config, params, report = tf_checkpoints.load_tf(prefix, head, return_report=True)
    _, params2 = tf_checkpoints.load_tf(tmp_path / "ckpt", head)
    # bert_config.json has no labels: their number comes from the classifier's output_weights.
    labels = cfg.num_labels if head == "BertForSequenceClassification" else 2
    assert config == cfg.replace(num_labels=labels)
    assert not report.unused and not report.newly_initialized
    assert len(report.ignored) == 2 * len(variables) + 1  # adam_m, adam_v and global_step
    # Training state left behind is said (the converted model has none); buffers are not.
    assert f"skipped {len(report.ignored)} stored entries of training state" in report.summary()
    inputs = verify.sample_inputs(cfg, head)
    ours = verify.jax_outputs(cfg, params, head, inputs)
    theirs = verify.torch_outputs(torch_model, inputs)
    for key in ours:
        np.testing.assert_allclose(ours[key], theirs[key], atol=1e-5, err_msg=key)
    for a, b in zip(table.flatten_params(params).values(), table.flatten_params(params2).values()):
        np.testing.assert_array_equal(a, b)


def test_tf_checkpoint_missing_head_and_cli(tmp_path, capsys):
    cfg = ODD.replace(hidden_act="gelu")
    variables = original_variables(hf_model(cfg, "BertModel"))
    write_tf_checkpoint(variables, tmp_path / "ckpt", with_optimizer_slots=False)
    cfg.to_json_file(tmp_path / "ckpt" / "bert_config.json", original=True)
    with pytest.raises(table.ConversionError, match="cls/predictions/bias"):
        tf_checkpoints.load_tf(tmp_path / "ckpt", "BertForPreTraining")
    # The command line converts the encoder to a Hugging Face directory and verifies it.
    code = convert.main(
        [
            str(tmp_path / "ckpt"),
            str(tmp_path / "hf"),
            "--to",
            "hf",
            "--model",
            "BertModel",
            "--verify",
        ]
    )
    assert code == 0
    assert "worst max abs difference" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match="TF checkpoint"):
        tf_checkpoints.load_tf(tmp_path / "nothing" / "bert_model.ckpt", "BertModel")


def _run_convert(*args):
    """`python -m bert_jax.convert ...` as a user runs it: (exit code, stdout, stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", "bert_jax.convert", *map(str, args)], capture_output=True, text=True
    )
    return proc.returncode, proc.stdout, proc.stderr


def _embeddings(path):
    return hf.load_pytorch(path, "BertModel")[1]["embeddings"]["word_embeddings"]["embedding"]


@pytest.mark.e2e
def test_run_pretraining_folder_of_steps_without_checkpoint_file(tmp_path):
    """model.ckpt-N files as run_pretraining.py / run_classifier.py save them: the newest step is
    read (and named) without TF's `checkpoint` file, or when it names another machine's path;
    the .index or .data file itself stands for its checkpoint."""
    cfg = ODD.replace(hidden_act="gelu")
    variables = original_variables(hf_model(cfg, "BertModel"))
    folder = tmp_path / "run"
    for step, scale in ((500, 2.0), (1000, 1.0), (90, 3.0)):  # 90 < 500 < 1000 as numbers
        write_tf_checkpoint(
            {k: v * scale for k, v in variables.items()}, folder, False, "model.ckpt", step
        )
    cfg.to_json_file(folder / "bert_config.json", original=True)
    (folder / "checkpoint").unlink()
    word = variables["bert/embeddings/word_embeddings"]
    code, out, err = _run_convert(folder, tmp_path / "hf", "--to", "hf", "--model", "BertModel")
    assert code == 0, err
    assert "read model.ckpt-1000, the newest step of 3 checkpoints" in out
    np.testing.assert_array_equal(_embeddings(tmp_path / "hf"), word)
    # A `checkpoint` file written on the machine that trained: ignored, said so.
    (folder / "checkpoint").write_text(
        'model_checkpoint_path: "/home/someone/run/model.ckpt-500"\n'
        'all_model_checkpoint_paths: "/home/someone/run/model.ckpt-500"\n'
    )
    _, params, report = tf_checkpoints.load_tf(folder, "BertModel", return_report=True)
    np.testing.assert_array_equal(params["embeddings"]["word_embeddings"]["embedding"], word)
    assert any("/home/someone/run/model.ckpt-500, not in this folder" in n for n in report.notes)
    # One naming a checkpoint in the folder is followed.
    (folder / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-500"\n')
    _, params = tf_checkpoints.load_tf(folder, "BertModel")
    np.testing.assert_array_equal(params["embeddings"]["word_embeddings"]["embedding"], 2 * word)
    # The files themselves.
    for name in ("model.ckpt-90.index", "model.ckpt-90.data-00000-of-00001"):
        assert detect.detect_format(str(folder / name)) == "tf"
        _, params = tf_checkpoints.load_tf(folder / name, "BertModel")
        np.testing.assert_array_equal(
            params["embeddings"]["word_embeddings"]["embedding"], 3 * word
        )
    code, _, err = _run_convert(folder / "model.ckpt-90.index", tmp_path / "hf90", "--to", "hf",
                                "--model", "BertModel")  # fmt: skip
    assert code == 0, err
    np.testing.assert_array_equal(_embeddings(tmp_path / "hf90"), 3 * word)
    code, _, err = _run_convert(tmp_path, tmp_path / "x", "--to", "hf")  # no checkpoint there
    assert code == 1 and "no recognizable checkpoint" in err
    # A bert_config.json that does not describe the weights fails before anything is built.
    original = json.loads((folder / "bert_config.json").read_text())
    (folder / "bert_config.json").write_text(json.dumps({**original, "num_hidden_layers": 100000}))
    with pytest.raises(
        table.ConversionError,
        match=rf"bert_config.json: num_hidden_layers=100000, but the weights \(.*model.ckpt-500\) "
        rf"hold {cfg.num_hidden_layers} layers",
    ):
        tf_checkpoints.load_tf(folder, "BertModel")


@pytest.mark.full
def test_tanh_gelu_of_later_original_code_is_chosen_by_flag(tmp_path):
    """google-research/bert's `gelu` is the tanh form since February 2019: bert_config.json says
    "gelu" either way. The import says which it assumes (erf) and --hidden-act gelu_new picks
    the tanh form, which then matches a transformers gelu_new model exactly."""
    cfg = ODD.replace(hidden_act="gelu_new")
    torch_model = hf_model(cfg, "BertModel", seed=3)
    folder = tmp_path / "ckpt"
    write_tf_checkpoint(original_variables(torch_model), folder, False, "model.ckpt", 7)
    (folder / "bert_config.json").write_text(
        json.dumps({**cfg.replace(hidden_act="gelu").to_original_dict()})
    )
    code, out, err = _run_convert(folder, tmp_path / "erf", "--to", "hf", "--model", "BertModel")
    assert code == 0, err
    assert "erf is assumed" in out and "--hidden-act gelu_new" in out
    assert (out + err).count("erf is assumed") == 1, err  # the report's note, said once
    assert json.loads((tmp_path / "erf" / "config.json").read_text())["hidden_act"] == "gelu"
    code, out, err = _run_convert(
        folder, tmp_path / "tanh", "--to", "hf", "--model", "BertModel", "--hidden-act", "gelu_new"
    )
    assert code == 0, err
    assert "erf is assumed" not in out and "hidden_act='gelu_new' (given)" in out
    assert json.loads((tmp_path / "tanh" / "config.json").read_text())["hidden_act"] == "gelu_new"
    inputs = verify.sample_inputs(cfg, "BertModel")
    theirs = verify.torch_outputs(torch_model, inputs)["last_hidden_state"]
    for name, atol_ok in (("tanh", True), ("erf", False)):
        config, params = hf.load_pytorch(tmp_path / name, "BertModel")
        ours = verify.jax_outputs(config, params, "BertModel", inputs)["last_hidden_state"]
        assert (np.max(np.abs(ours - theirs)) < 1e-5) == atol_ok
    # gelu_new has no unambiguous bert_config.json name: refused, saying what to do.
    with pytest.raises(ValueError, match="cannot be written to a bert_config.json unambiguously"):
        cfg.to_json_file(tmp_path / "bert_config.json", original=True)
    # The flag is for TF checkpoints only: a config.json names its activation.
    code, _, err = _run_convert(tmp_path / "tanh", tmp_path / "j", "--hidden-act", "gelu")
    assert code == 1 and "--hidden-act / hidden_act is for TF checkpoints" in err
