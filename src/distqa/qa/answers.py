"""What an answer is, shared by the data, the decoder and the metric; imports neither torch nor numpy.

Natural Questions gives each example a long answer (a span of whitespace tokens of the document, one
of its candidates) and a short answer (one or more spans, or YES/NO). A submission writes each as
``start:end`` (start inclusive, end exclusive), ``YES``, ``NO`` or blank; :class:`Gold` holds every
text that counts as right for one example. The rules for both live here once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple, Protocol


class AnswerType(IntEnum):
    """The five Natural Questions answer classes, in the order of the answer-type head's logits."""

    UNKNOWN = 0
    YES = 1
    NO = 2
    SHORT = 3
    LONG = 4

    @classmethod
    def of_annotation(cls, yes_no_answer: str, has_short: bool, has_long: bool) -> AnswerType:
        """Kaggle's rule: YES/NO when ``yes_no_answer`` says so, else SHORT when there are short spans,
        else LONG when there is a long answer, else UNKNOWN."""
        if yes_no_answer in ("YES", "NO"):
            return cls.YES if yes_no_answer == "YES" else cls.NO
        if has_short:
            return cls.SHORT
        return cls.LONG if has_long else cls.UNKNOWN


YES_NO = (AnswerType.YES, AnswerType.NO)


@dataclass(frozen=True)
class Span:
    """Whitespace-token span of the document, ``start`` inclusive, ``end`` exclusive."""

    start: int
    end: int

    @property
    def text(self) -> str:
        """As a submission writes it: ``start:end``."""
        return f"{self.start}:{self.end}"


class Answer(NamedTuple):
    """One example's prediction, as in the submission."""

    long: str
    """"" (blank) or "start:end"."""
    short: str
    """"" (blank), "start:end", "YES" or "NO"."""


class AnnotationTargets(Protocol):
    """What one annotation says (NQ's reader makes them: :class:`distqa.qa.nq.reader.Targets`)."""

    @property
    def answer_type(self) -> AnswerType: ...
    @property
    def long(self) -> Span | None: ...
    @property
    def short(self) -> tuple[Span, ...]: ...


@dataclass(frozen=True)
class Gold:
    """Every answer that counts as right for one example, over all its annotations."""

    long: frozenset[str]
    """"start:end" of every annotation's long answer; empty when no annotation has one."""
    short: frozenset[str]
    """"start:end" of every short span of every annotation, plus "YES"/"NO" for a yes_no_answer."""

    @classmethod
    def of(cls, answer_type: AnswerType, long: Span | None, short: Iterable[Span]) -> Gold:
        """The gold of one annotation."""
        shorts = {span.text for span in short}
        if answer_type in YES_NO:
            shorts.add(answer_type.name)
        return cls(frozenset([long.text] if long is not None else []), frozenset(shorts))

    @classmethod
    def from_targets(cls, targets: Iterable[AnnotationTargets]) -> Gold:
        """From the targets of each annotation (:func:`distqa.qa.nq.reader.parse_annotations`)."""
        return cls.union(cls.of(t.answer_type, t.long, t.short) for t in targets)

    @classmethod
    def union(cls, golds: Iterable[Gold]) -> Gold:
        """The gold of an example with several annotations: right when any annotation says so."""
        golds = list(golds)
        return cls(frozenset().union(*(g.long for g in golds)), frozenset().union(*(g.short for g in golds)))
