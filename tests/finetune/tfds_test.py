"""tfds readers on datasets built locally by the real tfds builders from the test files.

Each builder's download step is replaced by the local copies of the files it would download,
so tensorflow-datasets prepares `glue/*`, `squad/v2.0` and `conll2003` into a temporary
`data_dir` exactly as it would from the network; the readers then load them from there.
"""

import pathlib
import shutil
from unittest import mock

import numpy as np
import pytest

from bert_jax.finetune import glue, ner, squad
from tests.finetune.conftest import GLUE_DIR, TESTDATA

pytestmark = pytest.mark.tf


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    tfds = pytest.importorskip("tensorflow_datasets")
    root = tmp_path_factory.mktemp("tfds")
    downloads = root / "downloads"
    shutil.copytree(GLUE_DIR, downloads / "glue")
    conll = downloads / "conll2003"
    conll.mkdir()
    for name in ("train.txt", "valid.txt", "test.txt"):
        shutil.copy(TESTDATA / "conll_tiny.txt", conll / name)
    squad_file = str(TESTDATA / "squad_v2_tiny.json")

    def fake_download(_, urls):
        if isinstance(urls, dict):  # SQuAD asks for {"train": url, "dev": url}.
            return {key: squad_file for key in urls}
        if urls.endswith("conll2003.zip"):
            return pathlib.Path(conll)
        return str(downloads / "glue")  # GLUE zips unpack to <dir>/<TASK>/*.tsv.

    config = tfds.download.DownloadConfig(try_download_gcs=False)
    with mock.patch.object(tfds.download.DownloadManager, "download_and_extract", fake_download):
        for name in ("glue/rte", "glue/mnli", "glue/stsb", "squad/v2.0", "conll2003"):
            tfds.builder(name, data_dir=str(root)).download_and_prepare(download_config=config)
    return root


def test_glue_from_tfds_equals_the_tsv_files(data_dir):
    for task, split in [
        ("rte", "train"),
        ("rte", "dev"),
        ("mnli", "train"),
        ("mnli", "dev"),
        ("mnli_mismatched", "dev"),
        ("stsb", "train"),
    ]:
        from_tfds = glue.read_glue_tfds(task, split, data_dir=data_dir)
        from_tsv = glue.read_glue(task, GLUE_DIR, split)
        # tfds shuffles the examples when preparing; its idx is the row in the file.
        from_tfds = sorted(from_tfds, key=lambda e: int(e.guid))
        assert [(e.guid, e.texts) for e in from_tfds] == [(e.guid, e.texts) for e in from_tsv]
        # tfds keeps STS-B scores as float32.
        assert [e.label for e in from_tfds] == pytest.approx([e.label for e in from_tsv])
    # tfds numbers MNLI's classes entailment, neutral, contradiction; ids follow the GLUE files.
    contradiction = glue.read_glue_tfds("mnli_mismatched", "dev", data_dir=data_dir)[0]
    assert glue.get_dataset("mnli").label_names[contradiction.label] == "contradiction"
    test = glue.read_glue_tfds("rte", "test", data_dir=data_dir)
    assert [e.label for e in test] == [None]
    test = glue.read_glue_tfds("mnli", "test", data_dir=data_dir)
    assert test[0].texts == (
        "The old harbour is worth a visit at dawn.",
        "The harbour can be visited.",
    )


def test_glue_tfds_missing_dataset(data_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="is not prepared"):
        glue.read_glue_tfds("cola", "train", data_dir=tmp_path)


def test_squad_from_tfds(data_dir):
    stats = squad.SquadStats()
    from_tfds = squad.read_squad_tfds("squad/v2.0", "validation", data_dir=data_dir, stats=stats)
    from_json = squad.read_squad(TESTDATA / "squad_v2_tiny.json")
    assert sorted(from_tfds, key=lambda e: e.qas_id) == sorted(from_json, key=lambda e: e.qas_id)
    assert stats.unanswerable == 2


def test_conll2003_from_tfds(data_dir):
    from_tfds = ner.read_conll_tfds("test", data_dir=data_dir)
    from_file = ner.read_conll(TESTDATA / "conll_tiny.txt")
    assert sorted((e.words, e.tags) for e in from_tfds) == sorted(
        (e.words, e.tags) for e in from_file
    )
    assert all(np.isin([t for e in from_tfds for t in e.tags], ner.CONLL2003_LABELS))
