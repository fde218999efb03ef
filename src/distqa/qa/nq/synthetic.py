"""Synthetic Natural Questions: files in the exact format of the Kaggle ``simplified-nq-*.jsonl``.

Write a training file (one annotation per line) or a test file (no ``annotations`` key)::

    python -m distqa.qa.nq.synthetic --output /tmp/nq/simplified-nq-train.jsonl --examples 10000 --seed 0
    python -m distqa.qa.nq.synthetic --output /tmp/nq/simplified-nq-test.jsonl --examples 50 --seed 1 --test
    python -m distqa.qa.nq.synthetic --output /tmp/big.jsonl --examples 100000 --max-doc-tokens 3000 \\
        --answer-mix unknown=0.5,short=0.35,long=0.13,yes=0.01,no=0.01

``make nq-sample`` runs ``scripts/make_nq_sample.sh``, which writes the committed sample under
``data/nq-sample/`` (byte for byte the same on every machine; a test checks it).

Python API (all deterministic; nothing global is touched)::

    generate_example(rng, *, example_id=None, answer_type=None, answer_mix=DEFAULT_ANSWER_MIX,
                     min_doc_tokens=200, max_doc_tokens=1500, test=False, distractor_rate=0.3,
                     same_entity_rate=0.2, hard_negative_rate=0.3) -> dict
    make_example(seed, index, **same keywords) -> dict          # example ``index`` of the stream ``seed``
    iter_examples(n, *, seed=0, start=0, long_docs=0, long_doc_tokens=12000, **same keywords) -> Iterator[dict]
    write_jsonl(path, n, *, seed=0, **same keywords as iter_examples) -> GenerationStats
    answer_type_of(example) -> AnswerType                       # the class of a train line's annotation

Example ``index`` of a stream depends on ``(seed, index)`` and the keyword arguments only (its own
``random.Random`` is seeded with the string ``"synthetic-nq:{seed}:{index}"``), so files are identical on
every machine and Python >= 3.11, and a ``--test`` file and a train file written with the same arguments
hold the same questions and documents: the train file is the gold of the test file.

Format (one JSON object per line, UTF-8, keys in this order)::

    example_id              int, signed 64-bit (may be negative, as in the real test file)
    question_text           lower-case question
    document_text           whitespace-tokenized; HTML tags are tokens (<H1> <H2> <P> <Table> <Tr> <Th> <Td>
                            <Ul> <Ol> <Li> <Dl> <Dt> <Dd>); no token is empty or holds a space
    document_url            https://en.wikipedia.org//w/index.php?title=...&amp;oldid=...
    long_answer_candidates  one {"start_token", "end_token", "top_level"} per <P> <Table> <Tr> <Ul> <Ol> <Li>
                            <Dl> <Dt> <Dd> element, in document order; start is the opening tag's token, end
                            is exclusive (right after the closing tag); top_level is false for an element
                            inside another candidate (<Tr> in <Table>, <Li> in <Ul>, a list inside a <Li>)
    annotations             train only: [{"annotation_id", "yes_no_answer": NONE|YES|NO,
                            "long_answer": {"start_token", "end_token", "candidate_index"} (all -1 if none),
                            "short_answers": [{"start_token", "end_token"}, ...]}]

Documents (:mod:`distqa.qa.synthetic_text`): a title, ``<H1>``, a lead paragraph, then sections of
paragraphs, tables, lists and definition lists; length log-uniform in ``[min_doc_tokens, max_doc_tokens]``.

The synthetic task (learnable from the local context of one window of >= 128 tokens):

* Entities are "<modifier> <noun>" pairs (``MODIFIERS`` x ``NOUNS``, e.g. "northern river", written
  "Northern River" in documents); attributes are single words (``ATTRIBUTES``, e.g. "capital"); yes/no
  properties are single words (``PROPERTIES``, e.g. "destroyed"). These reserved words never occur in the
  filler text, so an entity appears in a document only inside a fact sentence.
* Fact sentences, placed inside paragraphs, table cells, list items or definitions::

      value fact   "The <attr> of the <Entity> is <value> ."          value: 1-4 tokens
                   "The <attr> of the <Entity> is <a> and <b> ."      two values, 1-2 tokens each
      long fact    "The <attr> of the <Entity> has a long history ."
      yes fact     "The <Entity> is <property> ."
      no fact      "The <Entity> is not <property> ."

* Questions and answers by answer type (the question names the entity and the attribute/property):

      SHORT    "what is the <attr> of the <entity>"    the document holds exactly one value fact for
               (entity, attr); its value token(s) are the short answer(s) (two spans for "<a> and <b>",
               in 20% of SHORT examples); the long answer is the top-level candidate holding the fact
      LONG     "tell me about the <attr> of the <entity>"   exactly one long fact for (entity, attr);
               the long answer is its top-level candidate; no short answer
      YES, NO  "is the <entity> <property>"   exactly one yes fact (YES) or no fact (NO) for
               (entity, property); long answer = its top-level candidate, short_answers empty
      UNKNOWN  any of the three question forms, about an entity that appears nowhere in the document;
               long answer all -1, no short answer, yes_no_answer NONE

* Distractors: 30% (``distractor_rate``) of the other top-level blocks hold a fact of a random form
  about another entity (which shares its modifier or noun with the question's entity 30% of the time,
  ``hard_negative_rate``), with any attribute or property (half the time the question's own when the
  kinds agree); in answerable examples 20% (``same_entity_rate``) of distractor facts are about the
  question's entity with a different attribute/property. A model must therefore match the question's
  entity and attribute, not just spot the phrasing. Lower rates make the task easier; 0 leaves the
  answer's fact alone in the document.
* The answer's block is placed at a uniformly random point of the document (15% of the time in its
  last tenth), so it is often far beyond the first window. Answer blocks are top-level and kept short
  (a paragraph of at most ~90 tokens, a table or list of at most ~100) so one fits in a window:
  70% paragraphs, 12% lists, 10% tables, 8% definition lists.

The answer mix (``DEFAULT_ANSWER_MIX``: unknown .35, short .35, long .15, yes .075, no .075) is
configurable; the real training file is 50.5% unknown, 34.8% short, 13.5% long only and 1.2% yes/no.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

from distqa.checkpoint.files import atomic_write
from distqa.qa.answers import AnswerType
from distqa.qa.synthetic_text import (
    ATTRIBUTES,
    CAPITALIZED,
    MODIFIERS,
    NOUNS,
    PROPERTIES,
    TWO_SHORT_ANSWERS,
    UNICODE_WORDS,
    Document,
    distractor_sentence,
    fact_sentence,
    question_for,
)

DEFAULT_ANSWER_MIX: dict[str, float] = {"unknown": 0.35, "short": 0.35, "long": 0.15, "yes": 0.075, "no": 0.075}
"""Probability of each answer type (keys: lower-case ``AnswerType`` names)."""

ANSWER_BLOCK_WEIGHTS = {"P": 0.70, "Ul": 0.12, "Table": 0.10, "Dl": 0.08}
_OTHER_BLOCKS = ("P",) * 8 + ("Table", "Ul", "Dl")  # blocks without the answer: 73% paragraphs
# Defaults of the difficulty keywords of generate_example (lower = easier):
DISTRACTOR_RATE = 0.30     # share of other top-level blocks that hold a distractor fact
SAME_ENTITY_RATE = 0.20    # share of distractor facts about the question's entity (answerable examples only)
HARD_NEGATIVE_RATE = 0.30  # share of other-entity distractors sharing a word with the question's entity
NEAR_END = 0.15            # share of answers placed in the last tenth of the document

_TYPES_BY_NAME = {t.name.lower(): t for t in AnswerType}
_QUESTION_FORMS = (AnswerType.SHORT, AnswerType.LONG, AnswerType.YES)  # YES and NO share one question form


def parse_answer_mix(text: str) -> dict[str, float]:
    """``"unknown=0.5,short=0.3,long=0.2"`` -> a normalized mix; types left out get probability 0."""
    mix: dict[str, float] = dict.fromkeys(_TYPES_BY_NAME, 0.0)
    for item in text.split(","):
        name, sep, value = item.partition("=")
        name = name.strip().lower()
        if not sep or name not in mix:
            raise ValueError(f"answer mix item {item!r}: expected NAME=WEIGHT with NAME in {', '.join(mix)}")
        try:
            mix[name] = float(value)
        except ValueError:
            raise ValueError(f"answer mix item {item!r}: {value!r} is not a number") from None
        if not mix[name] >= 0 or math.isinf(mix[name]):
            raise ValueError(f"answer mix item {item!r}: weights must be finite and >= 0")
    return _normalized(mix)


def _normalized(mix: Mapping[str, float]) -> dict[str, float]:
    unknown = set(mix) - set(_TYPES_BY_NAME)
    if unknown:
        raise ValueError(f"answer mix: unknown answer types {sorted(unknown)}; use {', '.join(_TYPES_BY_NAME)}")
    total = sum(mix.values())
    if not total > 0:
        raise ValueError("answer mix: the weights must not all be 0")
    return {name: mix.get(name, 0.0) / total for name in _TYPES_BY_NAME}


def generate_example(rng: random.Random, *, example_id: int | None = None, answer_type: AnswerType | None = None,
                     answer_mix: Mapping[str, float] = DEFAULT_ANSWER_MIX, min_doc_tokens: int = 200,
                     max_doc_tokens: int = 1500, test: bool = False, distractor_rate: float = DISTRACTOR_RATE,
                     same_entity_rate: float = SAME_ENTITY_RATE,
                     hard_negative_rate: float = HARD_NEGATIVE_RATE) -> dict[str, Any]:
    """One NQ example drawn from ``rng`` (see the module docstring for the task).

    ``answer_type`` forces the class (else drawn from ``answer_mix``); ``example_id`` defaults to a random
    signed 64-bit id; ``test`` leaves out ``annotations`` (the example is otherwise the same). The
    difficulty: ``distractor_rate`` is the share of non-answer top-level blocks holding a distractor fact,
    ``same_entity_rate`` the share of those about the question's entity (with another attribute or
    property; answerable examples only), ``hard_negative_rate`` the share of the others whose entity shares
    a word with the question's. All 0 leaves the answer's fact alone in the document.
    """
    for name, rate in (("distractor_rate", distractor_rate), ("same_entity_rate", same_entity_rate),
                       ("hard_negative_rate", hard_negative_rate)):
        if not 0 <= rate <= 1:
            raise ValueError(f"{name} must be in [0, 1], got {rate}")
    if not 1 <= min_doc_tokens <= max_doc_tokens:
        raise ValueError(f"need 1 <= min_doc_tokens ({min_doc_tokens}) <= max_doc_tokens ({max_doc_tokens})")
    if answer_type is None:
        mix = _normalized(answer_mix)
        answer_type = _TYPES_BY_NAME[rng.choices(list(mix), weights=list(mix.values()))[0]]
    if example_id is None:
        example_id = rng.getrandbits(64) - (1 << 63)

    # The question: its form (UNKNOWN borrows one), entity and attribute or property.
    form = answer_type if answer_type != AnswerType.UNKNOWN else rng.choice(_QUESTION_FORMS)
    if form == AnswerType.YES and answer_type == AnswerType.UNKNOWN:
        form = rng.choice((AnswerType.YES, AnswerType.NO))
    entity = (rng.choice(MODIFIERS), rng.choice(NOUNS))
    topic = rng.choice(PROPERTIES if form in (AnswerType.YES, AnswerType.NO) else ATTRIBUTES)
    answerable = answer_type != AnswerType.UNKNOWN

    answer_fact: list[str] | None = None
    spans: list[tuple[int, int]] = []
    if answerable:
        answer_fact, spans = fact_sentence(rng, form, entity, topic,
                                   two_values=form == AnswerType.SHORT and rng.random() < TWO_SHORT_ANSWERS)

    # The document: title, <H1>, a lead paragraph, then sections of blocks up to the drawn length.
    doc = Document(rng)
    target = round(math.exp(rng.uniform(math.log(min_doc_tokens), math.log(max_doc_tokens + 1)))) - 1
    target = max(min_doc_tokens, min(max_doc_tokens, target))
    answer_at = target * (rng.uniform(0.9, 1.0) if rng.random() < NEAR_END else rng.random())
    title = [rng.choice(CAPITALIZED), *rng.choices(CAPITALIZED, k=rng.randint(0, 2))]
    if rng.random() < 0.1:
        title.append(rng.choice(UNICODE_WORDS[:10]))
    doc.tokens.extend([*title, "-", "Wikipedia", "<H1>", *title, "</H1>"])

    long_answer = -1
    short_answers: list[dict[str, int]] = []

    def emit(kind: str, is_answer: bool) -> None:
        nonlocal long_answer
        if is_answer:
            long_answer = len(doc.candidates)
            position = doc.block(kind, answer_fact, target - len(doc.tokens))
            short_answers.extend({"start_token": position + s, "end_token": position + e} for s, e in spans)
        else:
            fact = (distractor_sentence(rng, entity, form, topic, answerable, same_entity_rate, hard_negative_rate)
                    if rng.random() < distractor_rate else None)
            doc.block(kind, fact, target - len(doc.tokens))

    kinds, weights = list(ANSWER_BLOCK_WEIGHTS), list(ANSWER_BLOCK_WEIGHTS.values())
    emit("P", answerable and answer_at <= len(doc.tokens))
    while len(doc.tokens) < target:
        heading = "<H3>" if rng.random() < 0.2 else "<H2>"
        doc.tokens.append(heading)
        doc.cell(4)
        doc.tokens.append(heading[0] + "/" + heading[1:])
        for _ in range(rng.randint(1, 5)):
            if len(doc.tokens) >= target:
                break
            place = answerable and long_answer < 0 and len(doc.tokens) >= answer_at
            kind = rng.choices(kinds, weights=weights)[0] if place else rng.choice(_OTHER_BLOCKS)
            emit(kind, place)
    if answerable and long_answer < 0:
        emit(rng.choices(kinds, weights=weights)[0], True)

    example: dict[str, Any] = {
        "example_id": example_id,
        "question_text": question_for(form, entity, topic),
        "document_text": " ".join(doc.tokens),
        "document_url": "https://en.wikipedia.org//w/index.php?title={}&amp;oldid={}".format(
            quote("_".join(title)), rng.randint(100_000_000, 999_999_999)),
        "long_answer_candidates": [{"start_token": s, "end_token": e, "top_level": t} for s, e, t in doc.candidates],
    }
    if not test:
        annotation_id = rng.getrandbits(63)
        if long_answer >= 0:
            start, end, _ = doc.candidates[long_answer]
            long = {"start_token": start, "end_token": end, "candidate_index": long_answer}
        else:
            long = {"start_token": -1, "end_token": -1, "candidate_index": -1}
        yes_no = {AnswerType.YES: "YES", AnswerType.NO: "NO"}.get(answer_type, "NONE")
        example["annotations"] = [{"annotation_id": annotation_id, "yes_no_answer": yes_no, "long_answer": long,
                                   "short_answers": short_answers}]
    return example


def make_example(seed: int, index: int, **kwargs: Any) -> dict[str, Any]:
    """Example ``index`` of the stream ``seed``: a function of ``(seed, index, kwargs)`` alone."""
    return generate_example(random.Random(f"synthetic-nq:{seed}:{index}"), **kwargs)


def iter_examples(n: int, *, seed: int = 0, start: int = 0, long_docs: int = 0, long_doc_tokens: int = 12000,
                  **kwargs: Any) -> Iterator[dict[str, Any]]:
    """Examples ``start .. start+n-1`` of the stream ``seed``.

    ``long_docs`` of them (spread evenly, the first at ``n // (2 * long_docs)``) are long documents of
    ``[long_doc_tokens // 2, long_doc_tokens]`` tokens instead; other keywords go to :func:`generate_example`.
    """
    long_at = {n * (2 * k + 1) // (2 * long_docs) for k in range(long_docs)} if long_docs else set()
    for i in range(start, start + n):
        if i - start in long_at:
            yield make_example(seed, i, **{**kwargs, "min_doc_tokens": max(1, long_doc_tokens // 2),
                                           "max_doc_tokens": max(1, long_doc_tokens)})
        else:
            yield make_example(seed, i, **kwargs)


def answer_type_of(example: Mapping[str, Any]) -> AnswerType:
    """The answer class of a train line's first annotation."""
    annotation = example["annotations"][0]
    return AnswerType.of_annotation(annotation["yes_no_answer"], has_short=bool(annotation["short_answers"]),
                                    has_long=annotation["long_answer"]["candidate_index"] >= 0)


@dataclass
class GenerationStats:
    """What :func:`write_jsonl` wrote."""

    examples: int = 0
    bytes: int = 0
    tokens: int = 0
    max_tokens: int = 0
    seconds: float = 0.0
    answer_types: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        rate = self.examples / max(self.seconds, 1e-9)
        mix = ", ".join(f"{name} {self.answer_types[name]}" for name in _TYPES_BY_NAME if self.answer_types[name])
        return (f"{self.examples} examples, {self.bytes / 1e6:.2f} MB, {self.tokens / max(self.examples, 1):.0f} "
                f"tokens/document on average (longest {self.max_tokens}) in {self.seconds:.2f} s: "
                f"{rate:.0f} examples/s, {self.bytes / 1e6 / max(self.seconds, 1e-9):.1f} MB/s"
                + (f"; answers: {mix}" if mix else ""))


def write_jsonl(path: str | os.PathLike[str], n: int, **kwargs: Any) -> GenerationStats:
    """Write ``n`` examples (see :func:`iter_examples` for the keywords) to ``path``, streaming.

    The file appears complete or not at all (:func:`distqa.checkpoint.files.atomic_write`); memory use does not
    grow with ``n``.
    """
    stats = GenerationStats()
    began = time.perf_counter()

    def write(f: IO[bytes]) -> None:
        for example in iter_examples(n, **kwargs):
            line = (json.dumps(example, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
            f.write(line)
            stats.examples += 1
            stats.bytes += len(line)
            tokens = example["document_text"].count(" ") + 1
            stats.tokens += tokens
            stats.max_tokens = max(stats.max_tokens, tokens)
            if "annotations" in example:
                stats.answer_types[answer_type_of(example).name.lower()] += 1

    atomic_write(Path(path), write)
    stats.seconds = time.perf_counter() - began
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m distqa.qa.nq.synthetic",
        description="Write a synthetic Natural Questions file in the Kaggle simplified-nq jsonl format.")
    parser.add_argument("--output", required=True, type=Path, help="the .jsonl file to write")
    parser.add_argument("--examples", required=True, type=int, help="number of examples (lines)")
    parser.add_argument("--seed", type=int, default=0,
                        help="stream seed; example i depends only on (seed, i) and the other options")
    parser.add_argument("--test", action="store_true", help="test-file form: no 'annotations' key")
    parser.add_argument("--min-doc-tokens", type=int, default=200, help="shortest document (whitespace tokens)")
    parser.add_argument("--max-doc-tokens", type=int, default=1500,
                        help="longest document; lengths are log-uniform in [min, max]")
    parser.add_argument("--long-docs", type=int, default=0,
                        help="this many of the examples (spread evenly) get a document of "
                             "[long-doc-tokens / 2, long-doc-tokens] tokens instead")
    parser.add_argument("--long-doc-tokens", type=int, default=12000, help="upper length of the --long-docs")
    parser.add_argument("--answer-mix", type=parse_answer_mix, default=DEFAULT_ANSWER_MIX,
                        help="answer-type weights, e.g. unknown=0.35,short=0.35,long=0.15,yes=0.075,no=0.075 "
                             "(the default; left-out types get 0)")
    parser.add_argument("--distractor-rate", type=float, default=DISTRACTOR_RATE,
                        help="share of non-answer blocks holding a fact about another entity or attribute")
    parser.add_argument("--same-entity-rate", type=float, default=SAME_ENTITY_RATE,
                        help="share of distractor facts about the question's entity (another attribute)")
    parser.add_argument("--hard-negative-rate", type=float, default=HARD_NEGATIVE_RATE,
                        help="share of other-entity distractors sharing a word with the question's entity")
    parser.add_argument("--quiet", action="store_true", help="print no summary")
    args = parser.parse_args(argv)
    if args.examples < 0 or not 0 <= args.long_docs <= args.examples:
        parser.error("need --examples >= 0 and 0 <= --long-docs <= --examples")
    if not 1 <= args.min_doc_tokens <= args.max_doc_tokens:
        parser.error("need 1 <= --min-doc-tokens <= --max-doc-tokens")
    for name in ("distractor_rate", "same_entity_rate", "hard_negative_rate"):
        if not 0 <= getattr(args, name) <= 1:
            parser.error(f"--{name.replace('_', '-')} must be in [0, 1]")
    stats = write_jsonl(args.output, args.examples, seed=args.seed, test=args.test,
                        min_doc_tokens=args.min_doc_tokens, max_doc_tokens=args.max_doc_tokens,
                        long_docs=args.long_docs, long_doc_tokens=args.long_doc_tokens, answer_mix=args.answer_mix,
                        distractor_rate=args.distractor_rate, same_entity_rate=args.same_entity_rate,
                        hard_negative_rate=args.hard_negative_rate)
    if not args.quiet:
        print(f"{args.output}: {stats.summary()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
