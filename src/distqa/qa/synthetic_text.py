"""The text of synthetic NQ documents: the vocabulary, a fixed token stream that text is cut from,
:class:`Document`, which builds a document of HTML blocks and records its long-answer candidates, and
the fact sentences and questions of the task.

Documents: a title ("<words> - Wikipedia"), ``<H1>`` with the title, a lead paragraph, then sections of
``<H2>`` (sometimes ``<H3>``) headings followed by blocks: paragraphs (most), two-column tables with a
``<Th>`` header row, ``<Ul>``/``<Ol>`` lists (sometimes with a nested list inside an item) and ``<Dl>``
definition lists. Text is drawn from the words of ``data/tokenizer-corpus.txt`` (each one a single
WordPiece of the tiny tokenizer, so documents tokenize compactly), with punctuation tokens
(``, . : ; ( ) ' % $ -``) and sometimes Unicode tokens (accents, Greek, Cyrillic, CJK, emoji,
typographic dashes and quotes) and hyphenated/abbreviated words. Document length (whitespace tokens) is
log-uniform in ``[min_doc_tokens, max_doc_tokens]``; the last block, a table or list, or the answer's block
may overshoot the maximum by up to ~120 tokens (documents have at least a title and one paragraph).

Everything here is deterministic: the stream is drawn once from a generator with a fixed seed, so every
machine and Python >= 3.11 builds the same documents (``distqa.qa.nq.synthetic`` describes the task).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from distqa.qa.answers import AnswerType

CANDIDATE_TAGS = ("P", "Table", "Tr", "Ul", "Ol", "Li", "Dl", "Dt", "Dd")
"""HTML elements that are long-answer candidates (as in the simplified NQ data)."""



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
POPULATION = FILLER * 3 + (".",) * 90 + PUNCTUATION * 5 + UNICODE_WORDS + ODD_WORDS
# Text is cut from random offsets of one fixed stream drawn from the population: a slice costs far less
# than drawing every token (the generator's hot path), and 2**17 offsets leave plenty of variety.
PUNCTUATION_SET = frozenset((".", *PUNCTUATION))
POOL_OFFSETS = 1 << 17  # slices start below this and are at most 512 tokens long (paragraphs: <= 150)


def _make_pool() -> list[str]:
    rng = random.Random("synthetic-nq:pool")
    pool = rng.choices(POPULATION, k=POOL_OFFSETS + 512)
    for i in range(1, len(pool)):  # no ". ," or ". ." runs
        if pool[i] in PUNCTUATION_SET and pool[i - 1] in PUNCTUATION_SET:
            pool[i] = rng.choice(FILLER)
    return pool


POOL = _make_pool()
CAPITALIZED = tuple(w.capitalize() for w in FILLER)
TITLED_MODIFIERS = {m: m.capitalize() for m in MODIFIERS}
TITLED_NOUNS = {n: n.capitalize() for n in NOUNS}


@dataclass
class Document:
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
        offset = int(rng.random() * POOL_OFFSETS)
        words = POOL[offset:offset + n_min + int(rng.random() * (n_max - n_min + 1))]
        if words:
            words[0] = rng.choice(CAPITALIZED) if words[0] in PUNCTUATION_SET else words[0].capitalize()
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
        offset = int(self.rng.random() * POOL_OFFSETS)
        words = POOL[offset:offset + 1 + int(self.rng.random() * n_max)]
        words[0] = self.rng.choice(CAPITALIZED) if words[0] in PUNCTUATION_SET else words[0].capitalize()
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


# --- facts and questions ------------------------------------------------------------------------

TWO_SHORT_ANSWERS = 0.20   # share of SHORT examples whose answer is "<a> and <b>"


def _entity_tokens(entity: tuple[str, str]) -> list[str]:
    return [TITLED_MODIFIERS[entity[0]], TITLED_NOUNS[entity[1]]]


def _value(rng: random.Random, max_len: int) -> list[str]:
    """A short-answer value of 1..max_len tokens."""
    r = rng.random()
    if r < 0.15:
        return [str(rng.randint(1000, 2020))]
    if r < 0.25 and max_len >= 2:
        return [str(rng.randint(2, 999)), rng.choice(("km", "kg", "metres", "million", "%", "people"))]
    if r < 0.30:
        return [rng.choice(UNICODE_WORDS[:14])]
    return rng.choices(CAPITALIZED, k=rng.randint(1, max_len))


def fact_sentence(rng: random.Random, form: AnswerType, entity: tuple[str, str], topic: str,
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


def distractor_sentence(rng: random.Random, entity: tuple[str, str], form: AnswerType, topic: str, answerable: bool,
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
        return fact_sentence(rng, kind, entity, other_topic, two_values=rng.random() < TWO_SHORT_ANSWERS)[0]
    same_kind = is_property == (form in (AnswerType.YES, AnswerType.NO))
    other_topic = topic if same_kind and rng.random() < 0.5 else rng.choice(pool)
    return fact_sentence(rng, kind, _other_entity(rng, entity, hard_negative_rate), other_topic,
                 two_values=rng.random() < TWO_SHORT_ANSWERS)[0]


def question_for(form: AnswerType, entity: tuple[str, str], topic: str) -> str:
    name = f"{entity[0]} {entity[1]}"
    if form == AnswerType.SHORT:
        return f"what is the {topic} of the {name}"
    if form == AnswerType.LONG:
        return f"tell me about the {topic} of the {name}"
    return f"is the {name} {topic}"
