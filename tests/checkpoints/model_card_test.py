"""Model cards (bert_jax.checkpoints.model_card): the Hub's metadata header and the run's numbers. The cards
of real tiny runs' exports are checked in train_test (pretraining) and tests/finetune/run_test.py."""

import json
import pathlib

import pytest

from bert_jax import convert
from bert_jax.checkpoints import model_card
from tests.common import TINY, load_config_file

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "testdata" / "hf_flax"


def card_metadata(card_dir) -> dict:
    """The YAML header of `card_dir/README.md`, parsed."""
    yaml = pytest.importorskip("yaml")
    text = (pathlib.Path(card_dir) / "README.md").read_text()
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def held_out_metrics(meta: dict) -> dict[str, float]:
    """{metric name: value} of the card's model-index."""
    (result,) = meta["model-index"][0]["results"]
    return {m["name"]: m["value"] for m in result["metrics"]}


def write_metrics(run_dir: pathlib.Path, rows) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_card_of_a_run_holds_its_last_evaluation_and_config(tmp_path):
    run = tmp_path / "run"
    write_metrics(
        run,
        [
            {"step": 0, "eval/loss": 6.0, "eval/commonest_token_share": 0.05},
            {"step": 3, "train/loss": 5.0},
            {"step": 6, "eval/loss": 4.5, "eval/mlm_accuracy": 0.2134},
        ],
    )
    config = load_config_file("pretrain.py").get_config("size=tiny")
    with config.unlocked():
        config.model_card.datasets = "wikipedia, bookcorpus"
        config.model_card.license = "cc-by-4.0"
    model_card.for_run(run / "hf", TINY, "BertForPreTraining", config, run)
    meta = card_metadata(run / "hf")
    assert meta["license"] == "cc-by-4.0" and meta["library_name"] == "transformers"
    assert meta["pipeline_tag"] == "fill-mask"
    assert meta["datasets"] == ["wikipedia", "bookcorpus"]
    assert held_out_metrics(meta) == {"eval/loss": 4.5, "eval/mlm_accuracy": 0.2134}
    text = (run / "hf" / "README.md").read_text()
    assert "## Held-out metrics at step 6" in text and "| hidden_size | 32 |" in text
    assert "- training steps: 1200" in text and '"num_train_steps": 1200' in text


def test_a_fine_tuning_card_takes_the_final_scores(tmp_path):
    seed_dir = tmp_path / "run" / "seed_1"
    write_metrics(
        seed_dir,
        [
            {"step": 10, "eval/accuracy": 0.7},
            {"step": 20, "final/accuracy": 0.9, "final/f1": 0.88},
            {"step": 20, "eval/accuracy": 0.1},  # nothing after the final scores counts
        ],
    )
    (tmp_path / "run" / "config.json").write_text(
        json.dumps({"job": "finetune", "finetune": {"name": "mrpc", "seeds": "0,1"}})
    )
    records = model_card.read_run(seed_dir)
    assert records.metrics == {"final/accuracy": 0.9, "final/f1": 0.88} and records.step == 20
    text = model_card.render(TINY, "BertForSequenceClassification", records)
    assert "- task: mrpc" in text and '- "mrpc"' in text  # the task is a tag too
    assert 'pipeline_tag: "text-classification"' in text


def test_convert_writes_a_card_when_asked(tmp_path):
    src = str(FIXTURES / "BertForQuestionAnswering")
    args = ["--to", "hf", "--model-card", "--datasets", "squad", "--license", "mit"]
    assert convert.main([src, str(tmp_path / "qa"), *args]) == 0
    meta = card_metadata(tmp_path / "qa")
    assert meta["license"] == "mit" and meta["datasets"] == ["squad"]
    assert meta["pipeline_tag"] == "question-answering" and "model-index" not in meta
    assert convert.main([src, str(tmp_path / "plain"), "--to", "hf_flax"]) == 0
    assert not (tmp_path / "plain" / "README.md").exists()  # only when asked
