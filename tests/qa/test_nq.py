"""The NQ pipeline: line validation, targets, windows that map back to the annotation, the cache."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import datasets
import numpy as np
import pytest
from transformers import AutoTokenizer

from distqa.distributed.sampler import ResumableDistributedSampler
from distqa.encoders.config import TINY_MODEL_DIR
from distqa.encoders.template import PairTemplate
from distqa.qa.answers import AnswerType, Span
from distqa.qa.feature_store import load_manifest
from distqa.qa.nq.cache import CacheRequest, NQWindows, assign_splits, build_cache, cached
from distqa.qa.nq.reader import BadLine, DataError, parse_example, scan
from distqa.qa.nq.windows import (
    Featurizer,
    WindowSettings,
    containing_candidate,
    token_span_to_pieces,
    window_span_to_tokens,
)

from support.nq_examples import (
    UNDECODABLE_LINES,
    UNDECODABLE_REASONS,
    UNICODE_WORDS,
    WORDS,
    check_labels_recover_the_gold,
    document,
    line,
    random_record,
    write_jsonl,
)

TOKENIZER = AutoTokenizer.from_pretrained(TINY_MODEL_DIR)
TEMPLATE = PairTemplate.of(TOKENIZER.backend_tokenizer)  # [CLS] question [SEP] document [SEP]
# Small windows: a few dozen tokens give many window boundaries per document.
SMALL = WindowSettings(max_seq_len=32, max_question_len=8, doc_stride=7, negative_keep_rate=1.0, seed=0)


def featurizer(settings: WindowSettings = SMALL, by_word: bool = True) -> Featurizer:
    """The tiny BERT's featurizer; ``by_word=False`` forces the whole-document path."""
    made = Featurizer(TOKENIZER.backend_tokenizer, TOKENIZER.pad_token_id, settings)
    assert made.by_word  # WordPiece behind the BERT pre-tokenizer: each word tokenises alone
    made.by_word = by_word
    return made


def parse(record: dict, labelled: bool = True):
    return parse_example(json.dumps(record), labelled)


def decoded_spans(features, row: int, window: int) -> Span:
    """The window's label mapped back to document tokens through the stored maps only."""
    w = {name: values[window] for name, values in features.windows.items()}
    return window_span_to_tokens(features.examples["piece_to_token"][row], int(w["doc_start"]),
                                 TEMPLATE.document_offset(int(w["question_len"])), int(w["start_position"]),
                                 int(w["end_position"]))


# --- windows: labels survive the round trip ------------------------------------------------------

@pytest.mark.parametrize("by_word", [True, False], ids=["word-cache", "whole-document"])
def test_gold_spans_survive_the_round_trip_at_window_boundaries_with_tags_inside(by_word: bool) -> None:
    rng = random.Random(7)
    examples = [parse(random_record(rng, i)) for i in range(150)]
    features = featurizer(by_word=by_word).featurize(examples, keep_all=True)
    assert check_labels_recover_the_gold(examples, features, TEMPLATE) > 100


def test_every_window_is_labelled_iff_a_target_fits_in_it() -> None:
    rng = random.Random(3)
    examples = [parse(random_record(rng, i)) for i in range(80)]
    features = featurizer().featurize(examples, keep_all=True)
    room = SMALL.max_seq_len - 3
    for window in range(len(features.windows["input_ids"])):
        row = int(features.windows["example_index"][window])
        piece_to_token = features.examples["piece_to_token"][row]
        question_len, doc_start = features.windows["question_len"][window], features.windows["doc_start"][window]
        end = doc_start + room - question_len
        targets = examples[row].targets
        fits = [token_span_to_pieces(piece_to_token, s) for s in targets.label_spans]
        fits = [(a, b) for a, b in fits if a <= b and doc_start <= a and b < end]
        assert (features.windows["start_position"][window] > 0) == bool(fits)


def test_every_wordpiece_keeps_the_index_of_its_whitespace_token() -> None:
    """Tokenising whole documents once gives, token by token, what the old per-word loop gave."""
    rng = random.Random(11)
    examples = [parse(random_record(rng, i)) for i in range(30)]
    features = featurizer(WindowSettings(512, 8, 100, 1.0, 0)).featurize(examples, keep_all=True)
    for row, example in enumerate(examples):
        piece_to_token = features.examples["piece_to_token"][row]
        windows = np.flatnonzero(features.windows["example_index"] == row)
        first = windows[0]
        q = features.windows["question_len"][first]
        length = features.windows["length"][first]
        pieces = features.windows["input_ids"][first][q + 2:length - 1]
        assert len(pieces) == len(piece_to_token)  # one window holds the whole document here
        for index, token in enumerate(example.document.split(" ")):
            expected = [] if token.startswith("<") else TOKENIZER.encode(token, add_special_tokens=False)
            assert pieces[piece_to_token == index].tolist() == expected, token


def test_word_cache_and_whole_document_paths_give_identical_features() -> None:
    rng = random.Random(13)
    examples = [parse(random_record(rng, i)) for i in range(60)]
    by_word = featurizer(by_word=True)
    first = by_word.featurize(examples[:30])
    again = by_word.featurize(examples)  # the second batch is served partly from the cache
    whole = featurizer(by_word=False).featurize(examples)
    for name in again.windows:
        assert np.array_equal(again.windows[name], whole.windows[name]), name
    for mine, theirs in zip(again.examples["piece_to_token"], whole.examples["piece_to_token"], strict=True):
        assert np.array_equal(mine, theirs)
    assert len(first.examples["example_id"]) == 30


def test_byte_level_bpe_tokenizers_map_pieces_to_their_words() -> None:
    """Tokenizers whose pieces carry the preceding space take the whole-document path; blanked
    tags and the spaces between words never become pieces, and every piece maps to its word."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator([" ".join(WORDS + UNICODE_WORDS)] * 20, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>", "</s>", "<pad>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> $B </s>",
                                                       special_tokens=[("<s>", 0), ("</s>", 1)])
    made = Featurizer(bpe, pad_id=2, settings=WindowSettings(512, 16, 100, 1.0, 0))
    assert not made.by_word
    rng = random.Random(17)
    examples = [parse(random_record(rng, i)) for i in range(20)]
    features = made.featurize(examples, keep_all=True)
    for row, example in enumerate(examples):
        window = int(np.flatnonzero(features.windows["example_index"] == row)[0])
        q, length = features.windows["question_len"][window], features.windows["length"][window]
        pieces = features.windows["input_ids"][window][q + 2:length - 1]
        piece_to_token = features.examples["piece_to_token"][row]
        for index, token in enumerate(example.document.split(" ")):
            text = bpe.decode(pieces[piece_to_token == index].tolist())
            assert text.strip() == ("" if token.startswith("<") else token), (index, token, text)


def test_windows_cover_the_document_with_the_stride() -> None:
    tokens, candidates = document([WORDS * 3])
    features = featurizer().featurize([parse(line(1, tokens, candidates))], keep_all=True)
    starts = features.windows["doc_start"]
    room = SMALL.max_seq_len - 3 - features.windows["question_len"][0]
    pieces = len(features.examples["piece_to_token"][0])
    assert starts.tolist() == list(range(0, starts[-1] + 1, SMALL.doc_stride))
    assert starts[-1] + room >= pieces > starts[-2] + room
    first = features.windows["input_ids"][0]
    assert first[0] == TOKENIZER.cls_token_id and first[features.windows["length"][0] - 1] == TOKENIZER.sep_token_id


def test_yes_and_no_label_the_long_answer_with_their_type() -> None:
    tokens, candidates = document([["it", "is", "green"], ["not", "here"]])
    for answer, expected in (("yes", AnswerType.YES), ("no", AnswerType.NO)):
        example = parse(line(1, tokens, candidates, "is it green", answer, candidate=0))
        features = featurizer().featurize([example], keep_all=True)
        labelled = features.windows["answer_type"] == expected
        assert labelled.any() and (features.windows["answer_type"][~labelled] == AnswerType.UNKNOWN).all()
        window = int(np.flatnonzero(labelled)[0])
        span = decoded_spans(features, 0, window)
        assert span == Span(candidates[0]["start_token"] + 1, candidates[0]["end_token"] - 1)  # the words
        assert containing_candidate(example.candidates, span) == 0


def test_unknown_examples_have_only_null_windows() -> None:
    tokens, candidates = document([WORDS[:20], WORDS[5:30]])
    example = parse(line(1, tokens, candidates, answer="none"))
    assert example.targets.answer_type == AnswerType.UNKNOWN and example.targets.long is None
    features = featurizer().featurize([example], keep_all=True)
    assert (features.windows["start_position"] == 0).all() and (features.windows["end_position"] == 0).all()
    assert (features.windows["answer_type"] == AnswerType.UNKNOWN).all()


def test_all_short_answers_are_kept_and_each_window_gets_one_that_fits() -> None:
    words = WORDS * 2
    tokens, candidates = document([words])
    first, second = (7, 9), (7 + len(WORDS), 8 + len(WORDS))  # far apart: no window holds both
    example = parse(line(1, tokens, candidates, answer="short", candidate=0, short=[first, second]))
    assert example.targets.short == (Span(*first), Span(*second))
    features = featurizer().featurize([example], keep_all=True)
    found = {decoded_spans(features, 0, w) for w in np.flatnonzero(features.windows["start_position"] > 0)}
    assert found == {Span(*first), Span(*second)}


@pytest.mark.parametrize("text", ["", "word", "<P>"])
def test_empty_and_one_token_documents(text: str) -> None:
    record = {"example_id": 1, "question_text": "what", "document_text": text, "long_answer_candidates": [],
              "annotations": [{"yes_no_answer": "NONE", "short_answers": [],
                               "long_answer": {"start_token": -1, "end_token": -1, "candidate_index": -1}}]}
    features = featurizer().featurize([parse(record)], keep_all=True)
    assert len(features.windows["input_ids"]) == 1
    pieces = len(TOKENIZER.encode(text, add_special_tokens=False)) if text == "word" else 0
    assert features.windows["length"][0] == features.windows["question_len"][0] + 3 + pieces
    assert len(features.examples["piece_to_token"][0]) == pieces


def test_one_token_document_with_an_answer() -> None:
    record = line(1, ["Paris"], [{"start_token": 0, "end_token": 1, "top_level": True}], answer="short",
                  candidate=0, short=[(0, 1)])
    features = featurizer().featurize([parse(record)], keep_all=True)
    assert decoded_spans(features, 0, 0) == Span(0, 1)


def test_unicode_text_maps_back_exactly() -> None:
    words = ["Zürich", "東京", "数据", "😀", "café", "naïve", "São", "Paulo", "x²", "—", "don't"]
    tokens, candidates = document([words, words[::-1]])
    short = (tokens.index("São"), tokens.index("Paulo") + 1)
    example = parse(line(1, tokens, candidates, "où est São Paulo ?", "short", 0, [short]))
    features = featurizer(WindowSettings(64, 16, 16, 1.0, 0)).featurize([example], keep_all=True)
    window = int(np.flatnonzero(features.windows["start_position"] > 0)[0])
    assert decoded_spans(features, 0, window) == Span(*short)


# --- malformed lines ---------------------------------------------------------------------------------

GOOD_TOKENS, GOOD_CANDIDATES = document([["a", "b", "c"], ["d", "e"]])


def good(**changes) -> dict:
    record = line(1, GOOD_TOKENS, GOOD_CANDIDATES, answer="short", candidate=0, short=[(7, 8)])
    record.update(changes)
    return record


def annotation(**changes) -> list[dict]:
    return [{**good()["annotations"][0], **changes}]


MALFORMED = {
    "truncated JSON": ('{"example_id": 1, "question_text": "wh', "not valid JSON"),
    "not an object": ("[1, 2]", "expected a JSON object"),
    "missing question": ({k: v for k, v in good().items() if k != "question_text"}, "'question_text' is missing"),
    "mistyped id": (good(example_id="abc"), "'example_id' should be a 64-bit integer"),
    "mistyped document": (good(document_text=["a"]), "'document_text' should be str"),
    "candidate beyond the document": (
        good(long_answer_candidates=[{"start_token": 0, "end_token": 99, "top_level": True}]),
        "'long_answer_candidates[0]': span [0, 99) is not inside the document's 15 tokens"),
    "end before start": (good(annotations=annotation(short_answers=[{"start_token": 8, "end_token": 7}])),
                         "'annotations[0].short_answers[0]': span [8, 7)"),
    "candidate index points nowhere": (
        good(annotations=annotation(long_answer={"start_token": 6, "end_token": 11, "candidate_index": 5})),
        "candidate_index' is 5 but the example has 2 long_answer_candidates"),
    "long answer is not its candidate": (
        good(annotations=annotation(long_answer={"start_token": 6, "end_token": 10, "candidate_index": 0})),
        "differs from candidate 0 [6, 11)"),
    "bad yes/no": (good(annotations=annotation(yes_no_answer="MAYBE")), "should be NONE, YES or NO"),
    "yes without long answer": (
        good(annotations=annotation(yes_no_answer="YES", short_answers=[],
                                    long_answer={"start_token": -1, "end_token": -1, "candidate_index": -1})),
        "gives a YES answer but no long answer"),
    "no annotations (test file)": ({k: v for k, v in good().items() if k != "annotations"},
                                   "'annotations' is missing; this looks like the test file"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_each_malformed_line_is_reported_with_file_line_and_field(case: str, tmp_path: Path) -> None:
    bad, message = MALFORMED[case]
    records = [good(example_id=i) for i in range(1, 300)]
    path = write_jsonl(tmp_path / "train.jsonl", [*records[:150], bad, *records[150:]])
    raw = bad if isinstance(bad, str) else json.dumps(bad)
    with pytest.raises(BadLine, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        parse_example(raw, labelled=True)
    result = scan(path, labelled=True)  # skip and count: 1 bad line of 300 is under the 1 % limit
    assert (len(result), result.bad_lines) == (299, 1)
    assert result.bad_reports[0].startswith(f"{path}:151: ")
    with pytest.raises(DataError, match=f"(?s){path}:151: .*Fix or remove the line"):
        scan(path, labelled=True, on_bad_line="fail")


@pytest.mark.parametrize("case", list(UNDECODABLE_LINES))
def test_an_undecodable_line_is_a_bad_line_like_any_other(case: str, tmp_path: Path) -> None:
    bad = UNDECODABLE_LINES[case]
    with pytest.raises(BadLine, match=UNDECODABLE_REASONS[case]):
        parse_example(bad, labelled=True)
    records: list[dict | bytes] = [good(example_id=i) for i in range(1, 300)]
    path = write_jsonl(tmp_path / "train.jsonl", [*records[:150], bad, *records[150:]])
    result = scan(path, labelled=True)
    assert (len(result), result.bad_lines) == (299, 1)
    assert result.bad_reports[0].startswith(f"{path}:151: ")
    with pytest.raises(DataError, match=f"(?s){path}:151: .*Fix or remove the line"):
        scan(path, labelled=True, on_bad_line="fail")


def test_a_utf8_byte_order_mark_before_the_first_line_is_read() -> None:
    assert parse_example(b"\xef\xbb\xbf" + json.dumps(good(example_id=5)).encode(), labelled=True).example_id == 5


def test_a_file_past_the_bad_line_fraction_is_refused(tmp_path: Path) -> None:
    records = [good(example_id=i) for i in range(1, 20)] + ["{oops"] * 2
    path = write_jsonl(tmp_path / "train.jsonl", records)
    with pytest.raises(DataError, match=r"(?s)2 of 21 lines \(9.5%\) are malformed.*train.jsonl:20"):
        scan(path, labelled=True, max_bad_line_fraction=0.05)
    assert scan(path, labelled=True, max_bad_line_fraction=0.1).bad_lines == 2


def test_skipped_lines_are_reported_under_the_nq_readers_logger(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", [good(example_id=i) for i in range(1, 20)] + ["{oops"])
    caplog.set_level("WARNING")
    scan(path, labelled=True, max_bad_line_fraction=0.1)
    skipped = [(r.name, r.levelname) for r in caplog.records if "skipped 1 malformed line(s) of 20" in r.getMessage()]
    assert skipped == [("distqa.qa.nq.reader", "WARNING")]


def test_repeated_example_ids_and_empty_or_missing_files(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", [good(example_id=i % 50) for i in range(51)])
    result = scan(path, labelled=True, max_bad_line_fraction=0.05)
    assert result.bad_lines == 1 and "example_id 0 repeats line 1" in result.bad_reports[0]
    with pytest.raises(DataError, match="holds no examples"):
        scan(write_jsonl(tmp_path / "empty.jsonl", []), labelled=True)
    with pytest.raises(DataError, match=r"(?s)no such file.*download_nq.sh"):
        scan(tmp_path / "missing.jsonl", labelled=True)
    with pytest.raises(DataError, match=r"missing.jsonl: no such file"):
        request(tmp_path / "missing.jsonl")


def test_test_files_need_no_annotations(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "test.jsonl", [line(i, GOOD_TOKENS, GOOD_CANDIDATES, labelled=False)
                                                  for i in range(5)])
    result = scan(path, labelled=False)
    assert len(result) == 5 and (result.answer_types == -1).all()


# --- the cache ---------------------------------------------------------------------------------------

def sample_file(tmp_path: Path, count: int = 120, seed: int = 1) -> Path:
    rng = random.Random(seed)
    return write_jsonl(tmp_path / "nq-train.jsonl", [random_record(rng, 10_000 + i) for i in range(count)])


def request(source: Path, **changes) -> CacheRequest:
    settings = WindowSettings(**{**vars(SMALL), "negative_keep_rate": 0.3, **changes})
    return CacheRequest.from_tokenizer(source, TOKENIZER, settings, validation_fraction=0.25)


def test_cache_is_reused_and_rebuilt_when_any_input_changes(tmp_path: Path) -> None:
    source = sample_file(tmp_path)
    cache_dir = tmp_path / "cache"
    assert cached(request(source), cache_dir) is None
    first = build_cache(request(source), cache_dir, num_proc=1, progress=False)
    assert cached(request(source), cache_dir) == first
    manifest_time = (first / "manifest.json").stat().st_mtime_ns
    assert build_cache(request(source), cache_dir, num_proc=1, progress=False) == first
    assert (first / "manifest.json").stat().st_mtime_ns == manifest_time  # reused, not rebuilt

    changed = {
        "doc_stride": request(source, doc_stride=5),
        "max_seq_len": request(source, max_seq_len=40),
        "negative_keep_rate": request(source, negative_keep_rate=0.5),
        "seed": request(source, seed=1),
    }
    other_tokenizer = AutoTokenizer.from_pretrained(TINY_MODEL_DIR)
    other_tokenizer.add_tokens(["riverbank"])
    changed["tokenizer"] = CacheRequest.from_tokenizer(source, other_tokenizer, request(source).settings,
                                                       validation_fraction=0.25)
    directories = {name: r.directory(cache_dir) for name, r in changed.items()}
    assert first not in directories.values() and len(set(directories.values())) == len(changed)

    with source.open("a") as file:  # a new line changes the file: its features must be rebuilt
        file.write(json.dumps(random_record(random.Random(0), 99)) + "\n")
    assert cached(request(source), cache_dir) is None
    assert build_cache(request(source), cache_dir, num_proc=1, progress=False) != first


def test_cache_is_identical_for_any_number_of_processes(tmp_path: Path) -> None:
    source = sample_file(tmp_path)
    one = build_cache(request(source), tmp_path / "one", num_proc=1, progress=False)
    two = build_cache(request(source), tmp_path / "two", num_proc=2, progress=False)
    for split in ("train", "validation"):
        for name in ("windows", "examples"):  # same rows in the same order (batch boundaries differ)
            tables = [datasets.Dataset.from_file(str(d / split / f"{name}.arrow")).data.table for d in (one, two)]
            assert tables[0].num_rows > 0 and tables[0].equals(tables[1])
    summary = load_manifest(two)
    splits = summary["splits"]
    assert summary["examples"] == 120 == splits["train"]["examples"] + splits["validation"]["examples"]
    assert not list(tmp_path.glob("two/*.tmp-*"))


def test_downsampling_is_deterministic_and_keeps_every_positive(tmp_path: Path) -> None:
    rng = random.Random(5)
    examples = [parse(random_record(rng, i)) for i in range(100)]

    def kept(rate: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
        features = featurizer(WindowSettings(32, 8, 7, rate, seed)).featurize(examples)
        return features.windows["doc_start"] * 1000 + features.windows["example_index"], \
            features.windows["start_position"]

    everything, labels = kept(1.0, 0)
    positives = everything[labels > 0]
    some, some_labels = kept(0.2, 0)
    assert np.array_equal(some, kept(0.2, 0)[0])
    assert not np.array_equal(some, kept(0.2, 1)[0])
    assert set(positives) <= set(some) and set(some) < set(everything)
    negatives, all_negatives = (some_labels == 0).sum(), (labels == 0).sum()
    assert 0.1 < negatives / all_negatives < 0.3
    assert np.array_equal(kept(0.0, 0)[0], positives)


def test_split_is_by_example_stratified_and_stable(tmp_path: Path) -> None:
    source = sample_file(tmp_path, count=200)
    directory = build_cache(request(source), tmp_path / "cache", num_proc=1, progress=False)
    sides = {split: datasets.Dataset.from_file(str(directory / split / "examples.arrow")) for split in
             ("train", "validation")}
    train_ids, validation_ids = (set(sides[s]["example_id"]) for s in ("train", "validation"))
    assert not train_ids & validation_ids and len(train_ids | validation_ids) == 200
    scanned = scan(source, labelled=True)
    for answer_type in AnswerType:
        total = int((scanned.answer_types == answer_type).sum())
        held_out = sum(1 for t in sides["validation"]["answer_type"] if t == answer_type)
        assert held_out == round(0.25 * total)
    # Windows of validation examples belong to the validation split only, and all of them are kept.
    validation = NQWindows(directory, "validation")
    assert len(validation) == load_manifest(directory)["splits"]["validation"]["windows"]
    # The same example stays on its side when the file is reordered.
    reversed_scan = scan(write_jsonl(tmp_path / "reversed.jsonl",
                                     [json.loads(x) for x in source.read_text().splitlines()[::-1]]), True)
    forward = dict(zip(scanned.example_ids, assign_splits(scanned, 0.25, 0), strict=True))
    backward = dict(zip(reversed_scan.example_ids, assign_splits(reversed_scan, 0.25, 0), strict=True))
    assert forward == backward


def test_cached_windows_read_like_dummy_items(tmp_path: Path) -> None:
    directory = build_cache(request(sample_file(tmp_path)), tmp_path / "cache", num_proc=1, progress=False)
    windows = NQWindows(directory, "train")
    item = windows[len(windows) - 1]
    assert item["input_ids"].shape == (SMALL.max_seq_len,) and item["input_ids"].dtype == np.int64
    length = int(item["attention_mask"].sum())
    assert item["input_ids"][length - 1] == TOKENIZER.sep_token_id and (item["input_ids"][length:] == 0).all()
    first_doc = int(np.flatnonzero(item["input_ids"] == TOKENIZER.sep_token_id)[0]) + 1
    assert item["token_type_ids"].tolist() == [0] * first_doc + [1] * (length - first_doc) + \
        [0] * (SMALL.max_seq_len - length)
    with pytest.raises(IndexError):
        windows[len(windows)]


def test_the_template_is_part_of_a_caches_name_and_a_cache_from_before_it_is_refused_in_one_line(
        tmp_path: Path) -> None:
    """Another pair template is another cache; a cache from before the template was stored (distqa 0.1) is no longer
    read (CHANGELOG.md): its manifest names none, and reading it says to build it again."""
    bert = request(sample_file(tmp_path))
    roberta_like = dataclasses.replace(bert, template=dataclasses.replace(TEMPLATE, middle=(3, 3), document_type=0))
    assert roberta_like.fingerprint() != bert.fingerprint()
    directory = build_cache(bert, tmp_path / "cache", num_proc=1, progress=False)
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest.pop("template") == TEMPLATE.to_dict()
    (directory / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=r"from before distqa 0.2.0 .* build it again: python -m distqa.prepare"):
        NQWindows(directory, "train")


@pytest.mark.parametrize(("size", "world_size"), [(103, 4), (100, 4), (7, 2), (5, 1)])
def test_rank_shards_are_disjoint_and_cover_the_set(size: int, world_size: int) -> None:
    shards = []
    for rank in range(world_size):
        sampler = ResumableDistributedSampler(range(size), num_replicas=world_size, rank=rank, seed=3)
        sampler.set_epoch(1)
        shards.append(list(sampler))
        assert len(shards[-1]) == len(sampler) >= sampler.min_samples_per_rank == size // world_size
    flat = [i for shard in shards for i in shard]
    assert sorted(flat) == list(range(size))


def test_unlabelled_files_keep_every_window_in_a_test_split(tmp_path: Path) -> None:
    """The Kaggle test file (no annotations): one "test" split, every window, no labels."""
    rng = random.Random(2)
    records = [random_record(rng, i) for i in range(40)]
    for record in records:
        del record["annotations"]
    source = write_jsonl(tmp_path / "test.jsonl", records)
    settings = WindowSettings(**{**vars(SMALL), "negative_keep_rate": 0.1})
    unlabelled = CacheRequest.from_tokenizer(source, TOKENIZER, settings, labelled=False, validation_fraction=0.25)
    assert unlabelled.splits == ("test",)
    directory = build_cache(unlabelled, tmp_path / "cache", num_proc=1, progress=False)
    summary = load_manifest(directory)
    assert summary["splits"]["test"]["examples"] == 40
    assert summary["splits"]["test"]["kept"] == summary["splits"]["test"]["windows"]  # none dropped
    windows = NQWindows(directory, "test")
    assert all(windows[i]["start_positions"] == 0 for i in range(len(windows)))
    examples = datasets.Dataset.from_file(str(directory / "test" / "examples.arrow"))
    assert set(examples["answer_type"]) == {-1} and examples["example_id"] == list(range(40))


def test_progress_is_logged_when_there_is_no_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """Platform jobs log to files, where tqdm stays off: the build reports progress in the log."""
    import distqa.qa.featurize
    import distqa.qa.nq.featurize

    monkeypatch.setattr(distqa.qa.featurize, "PROGRESS_LOG_SECONDS", 0)
    monkeypatch.setattr(distqa.qa.nq.featurize, "BATCH_BYTES", 4096)
    caplog.set_level("INFO", logger="distqa.qa.featurize")
    build_cache(request(sample_file(tmp_path, count=40)), tmp_path / "cache", num_proc=1, progress=False)
    reports = [r.getMessage() for r in caplog.records if r.getMessage().startswith("featurised")]
    assert reports and reports[-1].startswith("featurised 40 of 40 examples")


def test_an_interrupted_build_leaves_no_cache_and_its_leftovers_are_removed(tmp_path: Path) -> None:
    import socket

    source = sample_file(tmp_path, count=30)
    final = request(source).directory(tmp_path / "cache")
    # Left by a killed process of this host (pids on Linux stay below 2**22, so this one is not running).
    abandoned = final.with_name(f"{final.name}.tmp-{socket.gethostname()}-{2**22 + 7}")
    (abandoned / "parts").mkdir(parents=True)
    assert cached(request(source), tmp_path / "cache") is None  # a partial build is not a cache
    build_cache(request(source), tmp_path / "cache", num_proc=1, progress=False)
    assert not abandoned.exists() and (final / "manifest.json").is_file()
