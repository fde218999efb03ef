"""Question-context windows of SQuAD examples, cut by the tokenizer itself and labelled from character offsets.

The tokenizer encodes each (question, context) pair with its own pair template (``[CLS] q [SEP] c [SEP]`` for BERT,
``<s> q </s></s> c </s>`` for RoBERTa, …), truncating only the context to ``max_seq_len`` tokens and returning the
rest as overflowing windows that share ``window_overlap`` context tokens with the one before: ``tokenizers``' own
truncation with a stride, which is what ``tokenizer(question, context, truncation="only_second", stride=…,
return_overflowing_tokens=True)`` runs in ``transformers`` (and run_qa.py with it). A question longer than
``max_question_len`` tokens is cut at a token boundary first, so every window has room for context.

Labels, as run_qa.py's ``prepare_train_features`` gives them: a window whose context part holds the whole first
answer points at its first and last token (the tokens whose character offsets cover it); every other window, and
every window of an unanswerable question, points at position 0, the template's first special token (the null
answer). No window is dropped.

What a window keeps: its ids padded to ``max_seq_len``, its length, where its context part starts and ends and
where token type 1 starts (the template's segments), and each context token's character offsets, which map a
predicted span back to text. Free of torch and transformers: the featurising processes import ``tokenizers``, not them.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Encoding, Tokenizer

from distqa.qa.answers import AnswerType
from distqa.qa.featurize import SplitStats


@dataclass(frozen=True)
class SquadWindowSettings:
    max_seq_len: int
    max_question_len: int
    window_overlap: int


@dataclass
class SquadStats(SplitStats):
    """Counts over some examples; add them up with ``+=``."""

    examples: int = 0
    windows: int = 0
    positive: int = 0
    """Windows labelled with an answer."""
    answerable: int = 0
    unanswerable: int = 0
    unreachable: int = 0
    """Answerable examples whose first answer lies whole in no window (every window points at the null answer)."""


WINDOW_COLUMNS = {"length": np.int16, "context_start": np.int16, "context_end": np.int16, "segment_start": np.int16,
                  "example_index": np.int32, "start_position": np.int16, "end_position": np.int16,
                  "answer_type": np.int8}
"""The scalar columns of a window (besides ``input_ids`` and the context tokens' ``offsets``), with their types."""


@dataclass
class SquadFeatures:
    """The windows of some examples: ``input_ids`` (windows, max_seq_len), the :data:`WINDOW_COLUMNS`, and the
    (start, end) character offsets of the context tokens of all windows, flattened, ``offset_counts`` per window."""

    input_ids: np.ndarray
    columns: dict[str, np.ndarray]
    offsets: np.ndarray
    offset_counts: np.ndarray
    stats: SquadStats


class SquadFeaturizer:
    """Cuts (question, context, answer) triples into labelled windows; ``tokenizer_json`` is a fast tokenizer's
    ``backend_tokenizer.to_str()`` (its pair template included)."""

    def __init__(self, tokenizer_json: str, pad_id: int, settings: SquadWindowSettings) -> None:
        self.settings, self.pad_id = settings, pad_id
        self.questions = Tokenizer.from_str(tokenizer_json)
        self.questions.no_padding()
        self.questions.no_truncation()
        self.pairs = Tokenizer.from_str(tokenizer_json)
        self.pairs.no_padding()
        processor = self.pairs.post_processor
        specials = processor.num_special_tokens_to_add(True) if processor is not None else 0
        room = settings.max_seq_len - settings.max_question_len - specials
        if not 0 <= settings.window_overlap < room:
            # tokenizers panics (a Rust backtrace) past this bound; say which settings to change instead.
            raise ValueError(f"window_overlap ({settings.window_overlap}) must be below max_seq_len - "
                             f"max_question_len - {specials} special tokens of this tokenizer's pair template = "
                             f"{room}; lower window_overlap or max_question_len, or raise max_seq_len")
        self.pairs.enable_truncation(settings.max_seq_len, stride=settings.window_overlap, strategy="only_second")
        vocab_size = self.pairs.get_vocab_size(with_added_tokens=True)
        self.id_dtype = np.uint16 if vocab_size <= 2**16 else np.int32
        self._check_template()

    def _check_template(self) -> None:
        """What the windows assume of the pair template, checked once on a probe pair (the template is the same for
        every pair): it begins with a special token (the null answer's position), and its token types are zeros,
        then ones (stored as where the ones start)."""
        probe = self.pairs.encode("a question", "a context")
        if probe.sequence_ids[0] is not None:
            raise ValueError("the tokenizer's pair template does not begin with a special token ([CLS] or <s>), "
                             "which the null answer needs; use an encoder family whose template does")
        types = probe.type_ids
        if types != sorted(types) or not set(types) <= {0, 1}:
            raise ValueError(f"the tokenizer's pair template gives the token types {types}, not zeros then ones; "
                             "windows of this tokenizer cannot be stored")
        # Where the template puts type 1 and the context's end, the same in every window: type 1 starts this far from
        # the context's first token (None: there is no type 1), and this many special tokens follow the context.
        context = probe.sequence_ids.index(1)
        self.segment_from_context = types.index(1) - context if 1 in types else None
        self.trailing_specials = probe.sequence_ids[::-1].index(1)

    def capped_questions(self, questions: Sequence[str]) -> list[str]:
        """Each question cut after its ``max_question_len``-th token (at that token's last character)."""
        limit = self.settings.max_question_len
        encodings = self.questions.encode_batch(list(questions), add_special_tokens=False)
        return [q if len(e.ids) <= limit else q[:e.offsets[limit - 1][1]]
                for q, e in zip(questions, encodings, strict=True)]

    def featurize(self, questions: Sequence[str], contexts: Sequence[str], answers: Sequence[tuple[int, int] | None],
                  keep_offsets: bool = True) -> SquadFeatures:
        """The windows of each example, in order; ``answers`` holds the first answer's character span (start,
        end exclusive) per example, None for an unanswerable one (or an unlabelled input). ``keep_offsets`` False
        leaves the context tokens' offsets out (training windows: nothing decodes them)."""
        pairs = list(zip(self.capped_questions(questions), contexts, strict=True))
        encodings = self.pairs.encode_batch(pairs) if pairs else []
        stats = SquadStats(examples=len(pairs))
        ids: list[int] = []  # of every window, one after the other
        offsets: list[tuple[int, int]] = []  # the context tokens' of every window, one after the other
        counts: list[int] = []
        rows: list[tuple[int, ...]] = []  # the WINDOW_COLUMNS of each window, in their order
        for index, (encoding, answer) in enumerate(zip(encodings, answers, strict=True)):
            labelled = False
            # The question part is the same in every window of a pair: its context starts at the same position.
            sequence_ids = encoding.sequence_ids
            context_start = sequence_ids.index(1) if 1 in sequence_ids else len(sequence_ids) - self.trailing_specials
            for window in (encoding, *encoding.overflowing):
                row, context_offsets = self._window(window, context_start, answer, index, keep_offsets)
                labelled |= row[-1] == AnswerType.SHORT
                rows.append(row)
                ids += window.ids
                if keep_offsets:
                    offsets += context_offsets
                    counts.append(len(context_offsets))
            stats.windows += 1 + len(encoding.overflowing)
            stats.answerable += answer is not None
            stats.unanswerable += answer is None
            stats.unreachable += answer is not None and not labelled
        table = np.array(rows, dtype=np.int64).reshape(-1, len(WINDOW_COLUMNS))
        input_ids = np.full((len(rows), self.settings.max_seq_len), self.pad_id, dtype=self.id_dtype)
        input_ids[np.arange(self.settings.max_seq_len) < table[:, :1]] = ids  # row by row, up to each one's length
        typed = {name: table[:, i].astype(kind) for i, (name, kind) in enumerate(WINDOW_COLUMNS.items())}
        stats.positive = int((typed["answer_type"] == AnswerType.SHORT).sum())
        flat = np.array(offsets, dtype=np.int32).reshape(-1)
        counts_array = np.array(counts, dtype=np.int32) if keep_offsets else np.zeros(len(rows), dtype=np.int32)
        return SquadFeatures(input_ids, typed, flat, counts_array, stats)

    def _window(self, window: Encoding, context_start: int, answer: tuple[int, int] | None, index: int,
                keep_offsets: bool) -> tuple[tuple[int, ...], list[tuple[int, int]]]:
        """One window's :data:`WINDOW_COLUMNS` (``index``: its example's), and its context tokens' character offsets
        (when kept, or needed for the labels). The context runs from ``context_start`` to the trailing specials."""
        length = len(window)
        context_end = max(context_start, length - self.trailing_specials)
        segment_start = length if self.segment_from_context is None else context_start + self.segment_from_context
        spans = window.offsets[context_start:context_end] if answer is not None or keep_offsets else []
        start = end = 0
        answer_type = AnswerType.UNKNOWN
        if answer is not None and spans and spans[0][0] <= answer[0] and spans[-1][1] >= answer[1]:
            # The last token that starts at or before the answer, the first that ends at or after it.
            start = context_start + bisect.bisect_right(spans, answer[0], key=operator.itemgetter(0)) - 1
            end = context_start + min(bisect.bisect_left(spans, answer[1], key=operator.itemgetter(1)), len(spans) - 1)
            answer_type = AnswerType.SHORT
        return (length, context_start, context_end, segment_start, index, start, end, int(answer_type)), spans


def answer_span(text: str, start: int) -> tuple[int, int]:
    """The characters of an answer without the white space around it: (start, end exclusive)."""
    stripped = text.strip()
    start += len(text) - len(text.lstrip())
    return start, start + len(stripped)
