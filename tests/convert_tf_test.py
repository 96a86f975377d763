"""Original google-research/bert TF checkpoints, written by TensorFlow itself."""

import numpy as np
import pytest

from bert_jax import convert
from tests.common import ODD
from tests.convert_test import hf_model

tf = pytest.importorskip("tensorflow")
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


def write_tf_checkpoint(variables, folder, with_optimizer_slots=True):
    """tf.compat.v1 Saver, graph mode: the checkpoint layout of the original run_pretraining.py."""
    folder.mkdir(parents=True, exist_ok=True)
    graph = tf.Graph()
    with graph.as_default():
        for name, value in variables.items():
            tf.compat.v1.get_variable(name, initializer=tf.constant(value))
            if with_optimizer_slots:
                tf.compat.v1.get_variable(name + "/adam_m", initializer=tf.zeros_like(value))
                tf.compat.v1.get_variable(name + "/adam_v", initializer=tf.zeros_like(value))
        tf.compat.v1.train.get_or_create_global_step()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            return saver.save(sess, str(folder / "bert_model.ckpt"))


@pytest.mark.parametrize("head", ["BertForPreTraining", "BertForSequenceClassification"])
def test_load_original_tf_checkpoint(tmp_path, head):
    cfg = ODD.replace(hidden_act="gelu")  # the original's names: gelu / relu
    torch_model = hf_model(cfg, head, seed=7)
    variables = original_variables(torch_model)
    prefix = write_tf_checkpoint(variables, tmp_path / "ckpt")
    cfg.to_json_file(tmp_path / "ckpt" / "bert_config.json", original=True)
    # Loading by prefix and by folder give the same result.
    config, params, report = convert.load_tf(prefix, head, return_report=True)
    _, params2 = convert.load_tf(tmp_path / "ckpt", head)
    # bert_config.json has no labels: their number comes from the classifier's output_weights.
    labels = cfg.num_labels if head == "BertForSequenceClassification" else 2
    assert config == cfg.replace(num_labels=labels)
    assert not report.unused and not report.newly_initialized
    assert len(report.ignored) == 2 * len(variables) + 1  # adam_m, adam_v and global_step
    inputs = convert.sample_inputs(cfg, head)
    ours = convert._jax_outputs(cfg, params, head, inputs)
    theirs = convert.torch_outputs(torch_model, inputs)
    for key in ours:
        np.testing.assert_allclose(ours[key], theirs[key], atol=1e-5, err_msg=key)
    for a, b in zip(convert._flatten(params).values(), convert._flatten(params2).values()):
        np.testing.assert_array_equal(a, b)


def test_tf_checkpoint_missing_head_and_cli(tmp_path, capsys):
    cfg = ODD.replace(hidden_act="gelu")
    variables = original_variables(hf_model(cfg, "BertModel"))
    write_tf_checkpoint(variables, tmp_path / "ckpt", with_optimizer_slots=False)
    cfg.to_json_file(tmp_path / "ckpt" / "bert_config.json", original=True)
    with pytest.raises(convert.ConversionError, match="cls/predictions/bias"):
        convert.load_tf(tmp_path / "ckpt", "BertForPreTraining")
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
        convert.load_tf(tmp_path / "nothing" / "bert_model.ckpt", "BertModel")
