"""Synthetic SQuAD: files of a learnable reading task, as SQuAD v2.0 JSON or Hugging Face JSON Lines.

    python -m distqa.qa.squad.synthetic --output data/squad-synthetic/train.json --articles 1500 --seed 0
    python -m distqa.qa.squad.synthetic --output /tmp/dev.jsonl --articles 100 --seed 1

A ``.json`` output is a SQuAD v2.0 file (``{"version": "v2.0", "data": [...]}``, ``is_impossible`` on every
question); a ``.jsonl`` output holds the same questions in the Hugging Face ``datasets`` squad schema, one a line.
``scripts/make_squad_sample.sh`` writes the committed sample (``data/squad-sample/``), byte for byte the same on
every machine and Python >= 3.11 (article ``i`` of seed ``s`` depends only on ``(s, i)`` and the options; a test
checks the sample).

The task, learnable from one window of 128 tokens. An article is about two entities ("<modifier> <noun>" pairs
of :mod:`distqa.qa.synthetic_text`, written "Northern River"; sometimes sharing a word). Each paragraph is filler
text (words that are single wordpieces of the tiny tokenizer) holding 2-3 value facts about them (``--facts``),
"The <attribute> of the <Entity> is <value> ." (a value is 1-4 words: a name, a year, "42 km", a Unicode word; never
one that the official normalisation empties, such as "A" or "An The", which no prediction could match).
Each question names an entity and an attribute, "what is the <attribute> of the <entity>":

- answerable: the paragraph states that fact; the answer is its value, with its character offset;
- unanswerable (SQuAD v2; ``--unanswerable`` of the questions): the paragraph states that attribute of the other
  entity, or another attribute of this one, so a model must match both words, not just the phrasing; with
  ``--plausible`` below 1, that share of them, the rest ask about an entity the article never names (easier).

Fewer facts, fewer plausible unanswerable questions and shorter filler (``--filler-words``) make it easier:
``scripts/train_synthetic_squad.sh`` uses 1-2 facts, half plausible, filler of at most 10 words.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from distqa.checkpoint.files import atomic_write
from distqa.qa.answers import AnswerType
from distqa.qa.squad.metric import normalize_answer
from distqa.qa.synthetic_text import (
    ATTRIBUTES,
    CAPITALIZED,
    MODIFIERS,
    NOUNS,
    POOL,
    POOL_OFFSETS,
    PUNCTUATION_SET,
    fact_sentence,
    question_for,
)

PARAGRAPHS_PER_ARTICLE = 3
UNANSWERABLE = 1 / 3
"""Share of unanswerable questions (SQuAD v2.0's training set has a third, its dev set half)."""
FACTS = 3
"""Most facts a paragraph states (at least one fewer, and one)."""
PLAUSIBLE = 1.0
"""Share of the unanswerable questions that use the paragraph's words (SQuAD v2.0's are written to be plausible)."""
FILLER_WORDS = 25
SHARED_WORD_RATE = 0.3
"""Share of articles whose two entities share their modifier or their noun."""


class Paragraph:
    """A context under construction: its words, and where the value of each fact starts and ends (characters)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng, self.length = rng, 0
        self.words: list[str] = []
        self.values: dict[tuple[tuple[str, str], str], tuple[int, int]] = {}

    def add(self, words: list[str]) -> list[int]:
        """Append ``words``; returns the character offset of each."""
        starts = []
        for word in words:
            start = self.length + (1 if self.words else 0)
            starts.append(start)
            self.words.append(word)
            self.length = start + len(word)
        return starts

    def filler(self, low: int, high: int) -> None:
        offset = int(self.rng.random() * POOL_OFFSETS)
        words = POOL[offset:offset + self.rng.randint(low, high)]
        while words and words[-1] in PUNCTUATION_SET:  # the sentence's own full stop follows
            words.pop()
        if words:
            words[0] = self.rng.choice(CAPITALIZED) if words[0] in PUNCTUATION_SET else words[0].capitalize()
            self.add([*words, "."])

    def fact(self, entity: tuple[str, str], attribute: str) -> None:
        while True:  # a value that the official normalisation empties ("A", "An The") leaves its question unscorable
            words, spans = fact_sentence(self.rng, AnswerType.SHORT, entity, attribute)
            first, end = spans[0]
            if normalize_answer(" ".join(words[first:end])):
                break
        starts = self.add(words)
        self.values[entity, attribute] = starts[first], starts[end - 1] + len(words[end - 1])

    @property
    def context(self) -> str:
        return " ".join(self.words)


def make_article(seed: int, index: int, paragraphs: int = PARAGRAPHS_PER_ARTICLE, unanswerable: float = UNANSWERABLE,
                 facts: int = FACTS, plausible: float = PLAUSIBLE, filler_words: int = FILLER_WORDS) -> dict[str, Any]:
    """Article ``index`` of the stream ``seed``, in SQuAD v2.0's layout. The difficulty: a paragraph states
    ``facts - 1`` to ``facts`` facts (at least one); ``plausible`` of the unanswerable questions use words of the
    paragraph, the others ask about an entity the article never names; each fact follows a sentence of 3 to
    ``filler_words`` words (shorter contexts fit shorter windows)."""
    rng = random.Random(f"synthetic-squad:{seed}:{index}")
    first = (rng.choice(MODIFIERS), rng.choice(NOUNS))
    while True:
        second = (rng.choice(MODIFIERS), rng.choice(NOUNS))
        if rng.random() < SHARED_WORD_RATE:
            second = (first[0], second[1]) if rng.random() < 0.5 else (second[0], first[1])
        if second != first:
            break
    entities = (first, second)
    article: dict[str, Any] = {"title": f"{first[0]} {first[1]}".title(), "paragraphs": []}
    for p in range(paragraphs):
        paragraph = Paragraph(rng)
        stated: list[tuple[tuple[str, str], str]] = []
        count = rng.randint(max(1, facts - 1), facts)
        while len(stated) < count:
            fact = (rng.choice(entities), rng.choice(ATTRIBUTES))
            if fact not in stated:
                stated.append(fact)
        for entity, attribute in stated:
            paragraph.filler(3, filler_words)
            paragraph.fact(entity, attribute)
        paragraph.filler(0, filler_words - 5)
        questions = []
        for q in range(rng.randint(2, 4)):
            entity, attribute = rng.choice(stated)
            if rng.random() < unanswerable:
                other, kind = entities[1 - entities.index(entity)], rng.random()
                if kind >= plausible:  # about an entity the article never names
                    while set(entity) & {*first, *second}:
                        entity = (rng.choice(MODIFIERS), rng.choice(NOUNS))
                elif kind < plausible / 2 and (other, attribute) not in stated:  # the attribute of the other entity
                    entity = other
                else:  # another attribute of this entity
                    while (entity, attribute) in stated:
                        attribute = rng.choice(ATTRIBUTES)
            span = paragraph.values.get((entity, attribute))
            answers = [{"text": paragraph.context[span[0]:span[1]], "answer_start": span[0]}] if span else []
            questions.append({"question": question_for(AnswerType.SHORT, entity, attribute),
                              "id": hashlib.sha1(f"{seed}:{index}:{p}:{q}".encode()).hexdigest()[:24],
                              "answers": answers, "is_impossible": not answers})
        article["paragraphs"].append({"context": paragraph.context, "qas": questions})
    return article


def iter_articles(articles: int, seed: int = 0, **kwargs: Any) -> Iterator[dict[str, Any]]:
    for index in range(articles):
        yield make_article(seed, index, **kwargs)


def as_json_lines(article: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The questions of an article as records of the Hugging Face squad schema."""
    for paragraph in article["paragraphs"]:
        for qa in paragraph["qas"]:
            yield {"id": qa["id"], "title": article["title"], "context": paragraph["context"],
                   "question": qa["question"], "answers": {"text": [a["text"] for a in qa["answers"]],
                                                           "answer_start": [a["answer_start"] for a in qa["answers"]]}}


def write(path: Path, articles: int, seed: int = 0, **kwargs: Any) -> dict[str, int]:
    """Write ``articles`` articles to ``path`` (SQuAD v2.0 JSON, or JSON Lines for a ``.jsonl``), atomically;
    returns the counts of paragraphs, questions and unanswerable ones."""
    data = list(iter_articles(articles, seed, **kwargs))
    if path.suffix == ".jsonl":
        text = "".join(json.dumps(record, ensure_ascii=False) + "\n" for a in data for record in as_json_lines(a))
    else:
        text = json.dumps({"version": "v2.0", "data": data}, ensure_ascii=False, indent=1) + "\n"
    atomic_write(path, lambda f: f.write(text.encode()))
    questions = [qa for a in data for p in a["paragraphs"] for qa in p["qas"]]
    return {"articles": articles, "paragraphs": sum(len(a["paragraphs"]) for a in data), "questions": len(questions),
            "unanswerable": sum(qa["is_impossible"] for qa in questions)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distqa.qa.squad.synthetic",
                                     description="Write a synthetic SQuAD v2.0 .json or Hugging Face .jsonl file.")
    parser.add_argument("--output", required=True, type=Path, help="a .json (SQuAD v2.0) or .jsonl file to write")
    parser.add_argument("--articles", required=True, type=int, help="number of articles")
    parser.add_argument("--seed", type=int, default=0, help="stream seed: article i depends only on (seed, i)")
    parser.add_argument("--paragraphs", type=int, default=PARAGRAPHS_PER_ARTICLE, help="paragraphs per article")
    parser.add_argument("--unanswerable", type=float, default=UNANSWERABLE, help="share of unanswerable questions")
    parser.add_argument("--facts", type=int, default=FACTS, help="most facts per paragraph (one fewer at least)")
    parser.add_argument("--plausible", type=float, default=PLAUSIBLE,
                        help="share of unanswerable questions using the paragraph's words (the rest: an absent entity)")
    parser.add_argument("--filler-words", type=int, default=FILLER_WORDS,
                        help="most words of the filler sentence before each fact (at least 5)")
    args = parser.parse_args(argv)
    if (args.articles < 1 or args.paragraphs < 1 or args.facts < 1 or args.filler_words < 5
            or not 0 <= args.unanswerable <= 1 or not 0 <= args.plausible <= 1):
        parser.error("need --articles, --paragraphs, --facts >= 1, --filler-words >= 5 and 0 <= --unanswerable, "
                     "--plausible <= 1")
    counts = write(args.output, args.articles, args.seed, paragraphs=args.paragraphs, unanswerable=args.unanswerable,
                   facts=args.facts, plausible=args.plausible, filler_words=args.filler_words)
    print(f"{args.output}: " + ", ".join(f"{count} {name}" for name, count in counts.items()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
