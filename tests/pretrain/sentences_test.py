"""Offline sentence splitting."""

import pytest

from bert_jax.pretrain.data.sentences import split_sentences


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "Mr. Smith went to Washington. He arrived at 3 p.m. on Monday.",
            ["Mr. Smith went to Washington.", "He arrived at 3 p.m. on Monday."],
        ),
        ('He said "Go!" Then he left.', ['He said "Go!"', "Then he left."]),
        ("See Fig. 3 for details. The end.", ["See Fig. 3 for details.", "The end."]),
        ("I said no. Then I left.", ["I said no.", "Then I left."]),
        (
            "The U.S. Army is big. J. R. R. Tolkien wrote it.",
            ["The U.S. Army is big.", "J. R. R. Tolkien wrote it."],
        ),
        ("Pi is 3.14 today! Is it? yes, it is.", ["Pi is 3.14 today!", "Is it? yes, it is."]),
        (
            "Stay! speak, speak! I charge thee, speak!",
            ["Stay! speak, speak!", "I charge thee, speak!"],
        ),
        ("我爱你。你好吗？好的", ["我爱你。", "你好吗？", "好的"]),
        ("(Really.) Yes.", ["(Really.)", "Yes."]),
        ("Wait... What now?", ["Wait...", "What now?"]),
        ("line one\nstill one. Two\n", ["line one still one.", "Two"]),
        ("No final period", ["No final period"]),
        ("", []),
        ("  \n\t ", []),
    ],
)
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


def test_split_keeps_every_character():
    text = "One. Two? Three! Mr. Four, e.g. five. 6 is six. «Seven.» Eight."
    assert "".join(split_sentences(text)).replace(" ", "") == text.replace(" ", "")
