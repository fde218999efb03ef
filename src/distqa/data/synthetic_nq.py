"""Synthetic Natural Questions: files in the exact format of the Kaggle ``simplified-nq-*.jsonl``.

Write a training file (one annotation per line) or a test file (no ``annotations`` key)::

    python -m distqa.data.synthetic_nq --output /tmp/nq/simplified-nq-train.jsonl --examples 10000 --seed 0
    python -m distqa.data.synthetic_nq --output /tmp/nq/simplified-nq-test.jsonl --examples 50 --seed 1 --test
    python -m distqa.data.synthetic_nq --output /tmp/big.jsonl --examples 100000 --max-doc-tokens 3000 \\
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

Documents: a title ("<words> - Wikipedia"), ``<H1>`` with the title, a lead paragraph, then sections of
``<H2>`` (sometimes ``<H3>``) headings followed by blocks: paragraphs (most), two-column tables with a
``<Th>`` header row, ``<Ul>``/``<Ol>`` lists (sometimes with a nested list inside an item) and ``<Dl>``
definition lists. Text is drawn from the words of ``data/tokenizer-corpus.txt`` (each one a single
WordPiece of the tiny tokenizer, so documents tokenize compactly), with punctuation tokens
(``, . : ; ( ) ' % $ -``) and sometimes Unicode tokens (accents, Greek, Cyrillic, CJK, emoji,
typographic dashes and quotes) and hyphenated/abbreviated words. Document length (whitespace tokens) is
log-uniform in ``[min_doc_tokens, max_doc_tokens]``; the last block, a table or list, or the answer's block
may overshoot the maximum by up to ~120 tokens (documents have at least a title and one paragraph).

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

from distqa.answers import AnswerType
from distqa.files import atomic_write

CANDIDATE_TAGS = ("P", "Table", "Tr", "Ul", "Ol", "Li", "Dl", "Dt", "Dd")
"""HTML elements that are long-answer candidates (as in the simplified NQ data)."""

DEFAULT_ANSWER_MIX: dict[str, float] = {"unknown": 0.35, "short": 0.35, "long": 0.15, "yes": 0.075, "no": 0.075}
"""Probability of each answer type (keys: lower-case ``AnswerType`` names)."""


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


MODIFIERS = _words(
    "northern green old small tropical medieval modern wooden national public official international original "
    "standard natural fresh real personal prime greater early late new main metropolitan olympic atomic "
    "freshwater oldest largest highest deepest external judicial")
NOUNS = _words(
    "river valley bridge palace island lake mountain village town city county province museum university "
    "hospital station railway volcano waterfall ocean planet moon company band team studio garage festival "
    "network conference association continent region state")
ATTRIBUTES = _words(
    "capital population language director singer president album area distance record legacy religion sport "
    "literature geography economics constitution government species career")
PROPERTIES = _words(
    "important online worldwide destroyed rebuilt published recorded broken invented signed spoken written "
    "split paired hosted issued")

# The words of data/tokenizer-corpus.txt minus the reserved words above: each is one WordPiece token.
FILLER = _words("""
a about actor adding after also although an and annotator anonymized answer any applies apply april are around
art arteries ash at athletes attracts august autumn average award based became beds before best between
billion biology blood body both branches building by canopy carbon carrying cell century championship charts
chemistry cities cm collection come companies competition consecutive contains contents countries country
covering craters current day days death decade december department describe device did dioxide directed
divides divisors document documents does during each earth east eight eighty element eleven emergency employs
encyclopedia end engine engineers erupted every executive expire explorer far february feeds field fifth fifty
film films final fire first five flows following football for forcing forests forty found founded four friday
from fruit games goods group has have hear heart higher history holds how hundred in includes insects inside
institutions into involved is it its itself january journey july june kg kilometres km larger last law lead
learning leave legislative life links list lives located long m mainly manuscripts many march marks match
mathematics may medicine merchants mercury metres million model monday more mountains music name nations
nearby negotiation next nine nineteenth no north not notes novel november now number nutrients october of
office on one opened or other outside over overlapping oxygen page paintings paragraph part patent peace
people period photosynthesis physics picture place plants played players politics positive power predicts
present process produce pumps queries question questions ran reached reaches reads received references
representatives residents rises role roughly row run s saturday scholars science scored sculptures sea search
seasons second see seeds seller sells separately september series seven several short side six smaller some
song songs south span spans spring start stayed stride sugar summer sun sunday sunlight surface suspension
table take takes telephone television ten term than that the their then there third thousand thousands three
through thursday time times to took traffic train treaty tuesday twelve twentieth two until use usually veins
villages visitors war was water wednesday weeks were west what when where which who why window windows wing
with won world wrote year years yes
""")

UNICODE_WORDS = ("café", "naïve", "São", "Zürich", "München", "Ελλάδα", "Москва", "東京", "北京市", "한국어",
                 "😀", "🚀", "–", "—", "“", "”", "½", "°C", "Ångström", "façade", "Dvořák", "Łódź")
ODD_WORDS = ("e-mail", "U.S.", "co-op", "'s", "n't", "1950s", "3.5", "2,000", "well-known", "#1", "&", "/")
PUNCTUATION = (",", ",", ",", ",", ",", ",", ":", ";", "(", ")", "'", "%", "$", "-", '"')

# The text population: words, about 7% full stops (sentences of ~14 tokens), 6% other punctuation, 1%
# Unicode and 1% odd tokens (list repetition is much faster than weighted sampling).
_POPULATION = FILLER * 3 + (".",) * 90 + PUNCTUATION * 5 + UNICODE_WORDS + ODD_WORDS
# Text is cut from random offsets of one fixed stream drawn from the population: a slice costs far less
# than drawing every token (the generator's hot path), and 2**17 offsets leave plenty of variety.
_PUNCTUATION_SET = frozenset((".", *PUNCTUATION))
_POOL_OFFSETS = 1 << 17  # slices start below this and are at most 512 tokens long (paragraphs: <= 150)


def _make_pool() -> list[str]:
    rng = random.Random("synthetic-nq:pool")
    pool = rng.choices(_POPULATION, k=_POOL_OFFSETS + 512)
    for i in range(1, len(pool)):  # no ". ," or ". ." runs
        if pool[i] in _PUNCTUATION_SET and pool[i - 1] in _PUNCTUATION_SET:
            pool[i] = rng.choice(FILLER)
    return pool


_POOL = _make_pool()
_CAPITALIZED = tuple(w.capitalize() for w in FILLER)
_TITLED_MODIFIERS = {m: m.capitalize() for m in MODIFIERS}
_TITLED_NOUNS = {n: n.capitalize() for n in NOUNS}

ANSWER_BLOCK_WEIGHTS = {"P": 0.70, "Ul": 0.12, "Table": 0.10, "Dl": 0.08}
_OTHER_BLOCKS = ("P",) * 8 + ("Table", "Ul", "Dl")  # blocks without the answer: 73% paragraphs
# Defaults of the difficulty keywords of generate_example (lower = easier):
DISTRACTOR_RATE = 0.30     # share of other top-level blocks that hold a distractor fact
SAME_ENTITY_RATE = 0.20    # share of distractor facts about the question's entity (answerable examples only)
HARD_NEGATIVE_RATE = 0.30  # share of other-entity distractors sharing a word with the question's entity
TWO_SHORT_ANSWERS = 0.20   # share of SHORT examples whose answer is "<a> and <b>"
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


@dataclass
class _Doc:
    """A document under construction: its tokens and its candidates ``[start, end, top_level]``."""

    rng: random.Random
    tokens: list[str] = field(default_factory=list)
    candidates: list[list[Any]] = field(default_factory=list)

    def open(self, tag: str, top_level: bool) -> int:
        """Emit ``<tag>`` as a candidate; returns its index, for :meth:`close`."""
        self.candidates.append([len(self.tokens), -1, top_level])
        self.tokens.append(f"<{tag}>")
        return len(self.candidates) - 1

    def close(self, tag: str, index: int) -> None:
        self.tokens.append(f"</{tag}>")
        self.candidates[index][1] = len(self.tokens)

    def text(self, n_min: int, n_max: int, fact: list[str] | None = None) -> int:
        """Sentences of ``n_min..n_max`` tokens in all with the fact among them; returns the fact's position."""
        rng = self.rng
        offset = int(rng.random() * _POOL_OFFSETS)
        words = _POOL[offset:offset + n_min + int(rng.random() * (n_max - n_min + 1))]
        if words:
            words[0] = rng.choice(_CAPITALIZED) if words[0] in _PUNCTUATION_SET else words[0].capitalize()
            words.append(".")
        if fact is None:
            self.tokens.extend(words)
            return -1
        # The fact goes at a sentence boundary: the start, the end or right after a full stop.
        cut = rng.randint(0, len(words))
        while 0 < cut < len(words) and words[cut - 1] != ".":
            cut += 1
        self.tokens.extend(words[:cut])
        position = len(self.tokens)
        self.tokens.extend(fact)
        self.tokens.extend(words[cut:])
        return position

    def cell(self, n_max: int) -> None:
        offset = int(self.rng.random() * _POOL_OFFSETS)
        words = _POOL[offset:offset + 1 + int(self.rng.random() * n_max)]
        words[0] = self.rng.choice(_CAPITALIZED) if words[0] in _PUNCTUATION_SET else words[0].capitalize()
        self.tokens.extend(words)

    # Blocks. Each emits one top-level candidate (with nested ones inside) and returns the token
    # position of the fact, or -1 when it holds none.

    def paragraph(self, fact: list[str] | None, n_max: int = 150) -> int:
        index = self.open("P", True)
        position = self.text(min(12, n_max), n_max, fact)
        self.close("P", index)
        return position

    def table(self, fact: list[str] | None) -> int:
        rng = self.rng
        table = self.open("Table", True)
        rows = rng.randint(2, 5)
        fact_row = rng.randint(1, rows) if fact else -1
        position = -1
        for row in range(rows + 1):
            tr = self.open("Tr", False)
            tag = "Th" if row == 0 else "Td"
            for column in range(2):
                self.tokens.append(f"<{tag}>")
                if row == fact_row and column == 0:
                    position = len(self.tokens)
                    self.tokens.extend(fact)  # type: ignore[arg-type]
                else:
                    self.cell(3 if row == 0 else 6)
                self.tokens.append(f"</{tag}>")
            self.close("Tr", tr)
        self.close("Table", table)
        return position

    def items(self, fact: list[str] | None, tag: str = "Ul", top_level: bool = True) -> int:
        rng = self.rng
        outer = self.open(tag, top_level)
        count = rng.randint(2, 5 if top_level else 3)
        fact_item = rng.randrange(count) if fact else -1
        nested = rng.randrange(count) if top_level and rng.random() < 0.15 else -1
        position = -1
        for item in range(count):
            li = self.open("Li", False)
            if item == fact_item:
                position = self.text(0, 6, fact)
            else:
                self.cell(10 if top_level else 5)
            if item == nested:
                self.items(None, "Ul", top_level=False)
            self.close("Li", li)
        self.close(tag, outer)
        return position

    def definitions(self, fact: list[str] | None) -> int:
        rng = self.rng
        dl = self.open("Dl", True)
        count = rng.randint(1, 3)
        fact_item = rng.randrange(count) if fact else -1
        position = -1
        for item in range(count):
            dt = self.open("Dt", False)
            self.cell(3)
            self.close("Dt", dt)
            dd = self.open("Dd", False)
            if item == fact_item:
                position = self.text(4, 20, fact)
            else:
                self.text(4, 20)
            self.close("Dd", dd)
        self.close("Dl", dl)
        return position

    def block(self, kind: str, fact: list[str] | None, room: int) -> int:
        """A block of ``kind``; a paragraph takes at most ``room`` tokens (an answer paragraph at most 60)."""
        if kind == "P":
            return self.paragraph(fact, max(6, min(60 if fact else 150, room)))
        if kind == "Table":
            return self.table(fact)
        if kind == "Ul":
            return self.items(fact, self.rng.choice(("Ul", "Ul", "Ol")))
        return self.definitions(fact)


def _entity_tokens(entity: tuple[str, str]) -> list[str]:
    return [_TITLED_MODIFIERS[entity[0]], _TITLED_NOUNS[entity[1]]]


def _value(rng: random.Random, max_len: int) -> list[str]:
    """A short-answer value of 1..max_len tokens."""
    r = rng.random()
    if r < 0.15:
        return [str(rng.randint(1000, 2020))]
    if r < 0.25 and max_len >= 2:
        return [str(rng.randint(2, 999)), rng.choice(("km", "kg", "metres", "million", "%", "people"))]
    if r < 0.30:
        return [rng.choice(UNICODE_WORDS[:14])]
    return rng.choices(_CAPITALIZED, k=rng.randint(1, max_len))


def _fact(rng: random.Random, form: AnswerType, entity: tuple[str, str], topic: str,
          two_values: bool = False) -> tuple[list[str], list[tuple[int, int]]]:
    """A fact sentence of ``form`` about ``entity`` and its attribute or property ``topic``.

    Returns the tokens and the short-answer spans relative to the sentence start (value facts only).
    """
    name = _entity_tokens(entity)
    if form == AnswerType.YES:
        return ["The", *name, "is", topic, "."], []
    if form == AnswerType.NO:
        return ["The", *name, "is", "not", topic, "."], []
    head = ["The", topic, "of", "the", *name]
    if form == AnswerType.LONG:
        return [*head, "has", "a", "long", "history", "."], []
    if two_values:
        a, b = _value(rng, 2), _value(rng, 2)
        start_a = len(head) + 1
        start_b = start_a + len(a) + 1
        return [*head, "is", *a, "and", *b, "."], [(start_a, start_a + len(a)), (start_b, start_b + len(b))]
    value = _value(rng, 4)
    return [*head, "is", *value, "."], [(len(head) + 1, len(head) + 1 + len(value))]


def _other_entity(rng: random.Random, avoid: tuple[str, str], hard_negative_rate: float) -> tuple[str, str]:
    while True:
        r = rng.random()
        if r < hard_negative_rate / 2:
            entity = (avoid[0], rng.choice(NOUNS))
        elif r < hard_negative_rate:
            entity = (rng.choice(MODIFIERS), avoid[1])
        else:
            entity = (rng.choice(MODIFIERS), rng.choice(NOUNS))
        if entity != avoid:
            return entity


def _distractor(rng: random.Random, entity: tuple[str, str], form: AnswerType, topic: str, answerable: bool,
                same_entity_rate: float, hard_negative_rate: float) -> list[str]:
    """A fact that does not answer the question (``form``, ``entity``, ``topic``)."""
    kind = rng.choice((AnswerType.SHORT, AnswerType.SHORT, AnswerType.LONG, AnswerType.YES, AnswerType.NO))
    is_property = kind in (AnswerType.YES, AnswerType.NO)
    pool = PROPERTIES if is_property else ATTRIBUTES
    if answerable and rng.random() < same_entity_rate:
        # The question's own entity with a different attribute or property than the question's.
        other_topic = rng.choice(pool)
        while other_topic == topic:
            other_topic = rng.choice(pool)
        return _fact(rng, kind, entity, other_topic, two_values=rng.random() < TWO_SHORT_ANSWERS)[0]
    same_kind = is_property == (form in (AnswerType.YES, AnswerType.NO))
    other_topic = topic if same_kind and rng.random() < 0.5 else rng.choice(pool)
    return _fact(rng, kind, _other_entity(rng, entity, hard_negative_rate), other_topic,
                 two_values=rng.random() < TWO_SHORT_ANSWERS)[0]


def _question(form: AnswerType, entity: tuple[str, str], topic: str) -> str:
    name = f"{entity[0]} {entity[1]}"
    if form == AnswerType.SHORT:
        return f"what is the {topic} of the {name}"
    if form == AnswerType.LONG:
        return f"tell me about the {topic} of the {name}"
    return f"is the {name} {topic}"


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
        answer_fact, spans = _fact(rng, form, entity, topic,
                                   two_values=form == AnswerType.SHORT and rng.random() < TWO_SHORT_ANSWERS)

    # The document: title, <H1>, a lead paragraph, then sections of blocks up to the drawn length.
    doc = _Doc(rng)
    target = round(math.exp(rng.uniform(math.log(min_doc_tokens), math.log(max_doc_tokens + 1)))) - 1
    target = max(min_doc_tokens, min(max_doc_tokens, target))
    answer_at = target * (rng.uniform(0.9, 1.0) if rng.random() < NEAR_END else rng.random())
    title = [rng.choice(_CAPITALIZED), *rng.choices(_CAPITALIZED, k=rng.randint(0, 2))]
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
            fact = (_distractor(rng, entity, form, topic, answerable, same_entity_rate, hard_negative_rate)
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
        "question_text": _question(form, entity, topic),
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

    The file appears complete or not at all (:func:`distqa.files.atomic_write`); memory use does not
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
        prog="python -m distqa.data.synthetic_nq",
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
