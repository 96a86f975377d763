"""Offline, rule-based sentence splitting for turning paragraphs into BERT "sentences".

Next-sentence prediction needs documents as lists of sentences. The original expects one
sentence per line; for running text (Wikipedia articles, plays) `split_sentences` cuts a
paragraph at sentence-final punctuation with a few rules that need no model or download:

* a cut follows `.`, `!`, `?` or `…` (plus any closing quotes/brackets) and whitespace, and comes
  before something that can start a sentence: an upper-case letter, a digit, an opening
  quote/bracket, or a letter of a script without case;
* no cut after a known abbreviation ("Mr.", "e.g.", "etc."), an initial ("J."), a dotted acronym
  ("U.S.") or a number-taking abbreviation followed by a number ("No. 5", "Fig. 3");
* the CJK full stops `。！？` end a sentence with or without a following space.

This errs towards too few cuts, which costs little: a "sentence" is only a unit that segment A or
B is built from.
"""

from __future__ import annotations

import re

# Abbreviations (lower-case, without the final period) after which a period does not end a
# sentence.
_ABBREVIATIONS = frozenset(
    """
    mr mrs ms mssrs messrs dr prof rev hon sr jr st mt ft gen col lt sgt capt cmdr adm maj gov
    sen rep pres supt insp det esq mme mlle
    vs etc cf al approx dept est inc ltd co corp bros assn univ
    jan feb mar apr jun jul aug sep sept oct nov dec
    mon tue tues wed thu thur thurs fri sat sun
    e.g i.e a.m p.m a.d b.c u.s u.k
    """.split()
)
# Abbreviations that do not end a sentence when a number follows ("No. 5", "pp. 12").
_NUMBER_ABBREVIATIONS = frozenset("no nos vol vols p pp fig figs art ch chap sec eq ref".split())
_CLOSERS = "\"'”’»)]}"
_OPENERS = "\"'“‘«([{"
_WESTERN_END = re.compile(r"(?:[.!?…]+)[" + re.escape(_CLOSERS) + r"]*(?=\s)")
_CJK_END = re.compile(r"[。！？]+[" + re.escape(_CLOSERS) + "」』）]*")
_ACRONYM = re.compile(r"^(?:[A-Za-z]\.)+[A-Za-z]$")


def _can_start_sentence(text: str, pos: int) -> bool:
    """Whether the text at `pos` (after whitespace) looks like the start of a sentence."""
    while pos < len(text) and text[pos] in _OPENERS:
        pos += 1
    if pos >= len(text):
        return False
    ch = text[pos]
    if ch.isdigit() or ch.isupper():
        return True
    return ch.isalpha() and ch.lower() == ch.upper()  # A script without case (CJK, Arabic, ...).


def _is_abbreviation(text: str, end: int, next_start: int) -> bool:
    """Whether the period at text[end] closes an abbreviation, initial or acronym."""
    start = end
    while start > 0 and not text[start - 1].isspace():
        start -= 1
    word = text[start:end].lstrip(_OPENERS)
    if not word:
        return False
    lower = word.lower()
    if lower in _ABBREVIATIONS:
        return True
    if len(word) == 1 and word.isalpha():  # An initial: "J. R. R. Tolkien".
        return True
    if _ACRONYM.match(word):  # "U.S", "e.g", "Ph.D" before the final period.
        return True
    if lower in _NUMBER_ABBREVIATIONS:
        return next_start < len(text) and text[next_start].isdigit()
    return False


def split_sentences(text: str) -> list[str]:
    """Splits a paragraph into sentences.

    Args:
      text: running text; internal newlines and runs of whitespace are treated as one space.

    Returns:
      The sentences, stripped, in order; [] for blank text.
    """
    text = " ".join(text.split())
    if not text:
        return []
    cuts = []
    for m in _WESTERN_END.finditer(text):
        next_start = m.end() + 1  # _WESTERN_END ends before exactly one space (text is collapsed).
        if not _can_start_sentence(text, next_start):
            continue
        final = m.group(0).rstrip(_CLOSERS)
        if final == "." and _is_abbreviation(text, m.start(), next_start):
            continue
        cuts.append(m.end())
    cuts.extend(m.end() for m in _CJK_END.finditer(text))
    sentences, start = [], 0
    for cut in sorted(set(cuts)):
        piece = text[start:cut].strip()
        if piece:
            sentences.append(piece)
        start = cut
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences
