"""Hand-built Natural Questions lines for the pipeline tests: exact control over every offset."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from distqa.encoders.template import PairTemplate
from distqa.qa.answers import AnswerType
from distqa.qa.nq.windows import Features, containing_candidate, window_span_to_tokens

WORDS = ["the", "river", "flows", "north", "past", "old", "stone", "bridges", "while", "children", "play", "near",
         "quiet", "gardens", "and", "merchants", "sell", "bread", "cheese", "wine", "honey", "apples", "fish",
         "during", "summer", "festival", "nights"]
UNICODE_WORDS = ["café", "naïve", "Zürich", "東京", "数据", "😀", "Ωmega", "São", "—", "don't", "x²"]


def document(blocks: list[list[str]], title: str = "Title") -> tuple[list[str], list[dict[str, Any]]]:
    """Whitespace tokens of ``<H1> title </H1>`` + one ``<P> … </P>`` per block, and their candidates."""
    tokens = [title, "-", "Wikipedia", "<H1>", title, "</H1>"]
    candidates = []
    for words in blocks:
        start = len(tokens)
        tokens += ["<P>", *words, "</P>"]
        candidates.append({"start_token": start, "end_token": len(tokens), "top_level": True})
    return tokens, candidates


def line(example_id: int, tokens: list[str], candidates: list[dict[str, Any]], question: str = "where is it",
         answer: str = "none", candidate: int = -1, short: list[tuple[int, int]] = (),
         labelled: bool = True) -> dict[str, Any]:
    """One NQ record; ``answer`` is none/long/short/yes/no, ``short`` are token spans (end exclusive)."""
    record: dict[str, Any] = {
        "example_id": example_id, "question_text": question, "document_text": " ".join(tokens),
        "document_url": f"https://en.wikipedia.org/?curid={example_id}", "long_answer_candidates": candidates,
    }
    if labelled:
        long = {"start_token": -1, "end_token": -1, "candidate_index": -1}
        if answer != "none":
            long = {**{k: candidates[candidate][k] for k in ("start_token", "end_token")},
                    "candidate_index": candidate}
        record["annotations"] = [{
            "annotation_id": example_id, "long_answer": long,
            "yes_no_answer": answer.upper() if answer in ("yes", "no") else "NONE",
            "short_answers": [{"start_token": s, "end_token": e} for s, e in short],
        }]
    return record


def random_record(rng: random.Random, example_id: int, max_blocks: int = 8) -> dict[str, Any]:
    """A random document with tags inside paragraphs, unicode words and any answer type."""
    blocks = []
    for _ in range(rng.randint(1, max_blocks)):
        words = [rng.choice(WORDS if rng.random() > 0.1 else UNICODE_WORDS) for _ in range(rng.randint(1, 40))]
        if len(words) > 3 and rng.random() < 0.3:  # markup inside a paragraph: tags within answers
            at = rng.randrange(1, len(words) - 1)
            words[at:at] = ["<B>", rng.choice(WORDS), "</B>"]
        blocks.append(words)
    tokens, candidates = document(blocks)
    answer = rng.choice(["none", "long", "short", "short", "yes", "no"])
    question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12)))
    if answer == "none":
        return line(example_id, tokens, candidates, question)
    candidate = rng.randrange(len(candidates))
    start, end = candidates[candidate]["start_token"], candidates[candidate]["end_token"]
    short = []
    if answer == "short":
        for _ in range(rng.randint(1, 3)):
            first = rng.randrange(start + 1, end - 1)
            last = rng.randrange(first, min(first + 4, end - 1))
            if not tokens[first].startswith("<") and not tokens[last].startswith("<"):
                short.append((first, last + 1))
        if not short:
            answer = "long"
    return line(example_id, tokens, candidates, question, answer, candidate, short)


def check_labels_recover_the_gold(examples: list, features: Features, template: PairTemplate) -> int:
    """Every labelled window's span, mapped back to document tokens through the stored maps alone, is a gold
    answer of its example: a short answer itself, or words of the annotated long-answer candidate (which the
    span identifies, tags included); every other window points at the first token. Returns the positives."""
    positives = 0
    for window in range(len(features.windows["input_ids"])):
        w = {name: int(values[window]) for name, values in features.windows.items() if name != "input_ids"}
        row, answer_type = w["example_index"], AnswerType(w["answer_type"])
        if w["start_position"] == 0:
            assert answer_type == AnswerType.UNKNOWN and w["end_position"] == 0
            continue
        positives += 1
        targets, example = examples[row].targets, examples[row]
        assert answer_type == targets.answer_type
        span = window_span_to_tokens(features.examples["piece_to_token"][row], w["doc_start"],
                                     template.document_offset(w["question_len"]), w["start_position"],
                                     w["end_position"])
        if answer_type == AnswerType.SHORT:
            assert span in targets.short, (example.example_id, span, targets.short)
        else:  # the long answer's words, which identify the annotated candidate, tags included
            assert containing_candidate(example.candidates, span) == targets.long_candidate
            assert tuple(example.candidates[targets.long_candidate, :2]) == (targets.long.start, targets.long.end)
    return positives


def write_jsonl(path: Path, records: list[dict[str, Any] | str | bytes]) -> Path:
    """Records as UTF-8 JSON lines; strings and bytes are written verbatim (for malformed lines)."""
    with path.open("wb") as file:
        for record in records:
            if isinstance(record, dict):
                record = json.dumps(record, ensure_ascii=False)
            file.write((record if isinstance(record, bytes) else record.encode()) + b"\n")
    return path


# Lines no UTF-8 JSON reader can take, each a bad line like any other (never a traceback).
UNDECODABLE_LINES: dict[str, bytes] = {
    # json.loads guesses UTF-16 from a leading NUL and raised UnicodeDecodeError on this one.
    "NUL-led": b"\x00\x01\x02 garbage",
    # A whole valid record, saved as UTF-16 (with its BOM) by an editor: json.loads would accept it.
    "UTF-16": json.dumps({"example_id": 7, "question_text": "q"}).encode("utf-16"),
    "Latin-1": '{"example_id": 7, "question_text": "café"}'.encode("latin-1"),
    "random bytes": bytes(random.Random(0).getrandbits(8) for _ in range(200)).replace(b"\n", b"\xff"),
}
UNDECODABLE_REASONS = {"NUL-led": "holds a NUL byte at column 1", "UTF-16": "not UTF-8 text: byte 0xff at column 1",
                       "Latin-1": "not UTF-8 text: byte 0xe9 at column 40", "random bytes": "not UTF-8 text"}
"""What the reader says of each line of UNDECODABLE_LINES."""
