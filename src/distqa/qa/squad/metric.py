"""The official SQuAD v2.0 metric (exact match and F1) and its files: gold data, predictions, the no-answer threshold.

Predictions are the official JSON object ``{question id: answer text}``, with ``""`` for "no answer". Scoring follows
the official evaluation script (``evaluate-v2.0.py``), whose numbers it gives:

- an answer is normalised: lower case, no punctuation, no articles (a, an, the), white space collapsed;
- exact match: 1 when the normalised prediction equals a normalised gold answer; F1: the harmonic mean of the
  precision and recall of the prediction's words against a gold answer's (as bags); both the best over the gold
  answers of the question;
- a question with no gold answer (or only answers that normalise to nothing) has the gold ``""``: an empty
  prediction scores 1 on both, any other 0;
- ``exact`` and ``f1`` are means over all questions, in percent; ``HasAns_*`` over the answerable ones and
  ``NoAns_*`` over the unanswerable ones, each printed only where there are such questions (v1.1 data has no NoAns).

Every gold question needs a prediction and no other prediction may appear: a skipped question would change the
score (the official script skips it with a printed line, and then its totals no longer agree). ``python -m
distqa.score --format squad`` is the command line; :func:`best_threshold` is the official ``best_f1_thresh``.
"""

from __future__ import annotations

import collections
import json
import re
import string
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

import numpy as np

from distqa.checkpoint.files import atomic_write
from distqa.config.errors import DataError
from distqa.qa.squad.reader import read_squad

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, punctuation removed, articles removed, white space collapsed: the official order."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(gold: str, prediction: str) -> float:
    return float(normalize_answer(gold) == normalize_answer(prediction))


def f1_score(gold: str, prediction: str) -> float:
    gold_words, predicted_words = normalize_answer(gold).split(), normalize_answer(prediction).split()
    if not gold_words or not predicted_words:  # a no-answer on either side: right only when both are
        return float(gold_words == predicted_words)
    same = sum((collections.Counter(gold_words) & collections.Counter(predicted_words)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted_words), same / len(gold_words)
    return 2 * precision * recall / (precision + recall)


def gold_answers(texts: Sequence[str]) -> list[str]:
    """The golds a prediction is compared with: the answers that normalise to something, else ``[""]``."""
    return [text for text in texts if normalize_answer(text)] or [""]


def question_scores(golds: Sequence[str], prediction: str) -> tuple[float, float]:
    """(exact match, F1) of one prediction: the best over the question's golds."""
    candidates = gold_answers(golds)
    return max(exact_match(g, prediction) for g in candidates), max(f1_score(g, prediction) for g in candidates)


def score_predictions(golds: Mapping[str, Sequence[str]], predictions: Mapping[str, str]) -> dict[str, float | int]:
    """The official metrics of ``predictions`` against ``golds`` (question id -> gold answer texts, empty for an
    unanswerable question); every gold id must have a prediction (:func:`read_predictions` checks files)."""
    scores = {qid: question_scores(answers, predictions[qid]) for qid, answers in golds.items()}
    result = _means(list(scores.values()))
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):  # by the gold's answers, as the official script
        chosen = [scores[qid] for qid, answers in golds.items() if bool(answers) == wanted]
        if chosen:
            result |= {f"{prefix}_{name}": value for name, value in _means(chosen).items()}
    return result


def _means(scores: list[tuple[float, float]]) -> dict[str, float | int]:
    total = len(scores)
    return {"exact": 100.0 * sum(e for e, _ in scores) / total, "f1": 100.0 * sum(f for _, f in scores) / total,
            "total": total}


def best_threshold(scores: np.ndarray, f1: np.ndarray, answerable: np.ndarray) -> float:
    """The no-answer threshold with the highest total F1 (the official ``best_f1_thresh``, with the score being
    how far the best span beats the null answer): answer a question when its ``scores`` value is above the
    threshold, else give ``""``. ``f1`` is each question's F1 when answered; an unanswered question scores 1 when
    it is not ``answerable``. The threshold sits halfway between the last score answered and the next (the widest
    margin on this data); -inf scores (no span at all) are never answered."""
    finite = np.isfinite(scores)
    if not finite.any():
        return 0.0
    order = np.argsort(-np.where(finite, scores, -np.inf), kind="stable")[:int(finite.sum())]
    # Total F1 when the k best scores are answered: their F1 plus the right abstentions among the rest.
    abstain = (~answerable).astype(np.float64)
    total = abstain.sum() + np.concatenate([[0.0], np.cumsum(f1[order] - abstain[order])])
    ranked = scores[order]
    cuts = np.flatnonzero(np.concatenate([[True], ranked[:-1] > ranked[1:], [True]]))  # between distinct scores
    k = int(cuts[np.argmax(total[cuts])])  # the first best: as few answers as that takes, as the official
    if k == 0:
        return float(ranked[0] + 1.0)
    if k == len(ranked):
        return float(ranked[-1] - 1.0)
    return float((ranked[k - 1] + ranked[k]) / 2)


# --- files -------------------------------------------------------------------------------------------------

def read_gold(path: Path) -> dict[str, list[str]]:
    """Question id -> gold answer texts of a file in the SQuAD schema (any of its forms); any bad record fails,
    since skipping one would change the score. Only the texts are read, as the official script reads them."""
    return {e.id: [text for text, _ in e.answers]
            for e in read_squad(path, "gold", on_bad_line="fail", setting="--gold",
                                fix="Fix the gold file: every question is scored, none is skipped.").examples}


def read_predictions(path: Path, expected_ids: Collection[str]) -> dict[str, str]:
    """The ``{id: text}`` object of ``path``, with an answer for each of ``expected_ids`` and no other."""
    try:
        predictions = json.loads(Path(path).read_bytes().decode("utf-8-sig"))
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason}); predictions are a UTF-8 JSON "
                        "object") from None
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{err.lineno}:{err.colno}: not valid JSON: {err.msg}") from None
    if not isinstance(predictions, dict):
        raise DataError(f"{path}: expected a JSON object {{question id: answer text}}, got "
                        f"{type(predictions).__name__}")
    for qid, text in predictions.items():
        if not isinstance(text, str):
            raise DataError(f"{path}: the answer of {qid!r} should be a string (\"\" for no answer), got "
                            f"{type(text).__name__} {text!r:.40}")
    missing = [qid for qid in expected_ids if qid not in predictions]
    unknown = [qid for qid in predictions if qid not in expected_ids]
    for ids, what in ((missing, "has no answer for"), (unknown, "answers questions the gold does not have:")):
        if ids:
            raise DataError(f"{path} {what} {len(ids)} question(s), e.g. {', '.join(map(repr, ids[:3]))}; predict "
                            "the same file as the gold (every question, \"\" for no answer)")
    return predictions


def write_predictions(path: Path, predictions: Mapping[str, str]) -> None:
    """The official predictions file, in question order, written atomically."""
    text = json.dumps(dict(predictions), ensure_ascii=False, indent=2) + "\n"
    atomic_write(Path(path), lambda f: f.write(text.encode()))
