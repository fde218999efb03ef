"""The encoder swap, for each family of ``distqa.encoders.tiny`` (BERT, DistilBERT, ELECTRA, RoBERTa,
DeBERTa-v3, ModernBERT):
windows in the tokenizer's own pair format, the DummyDataset, the NQ sample's labels, two training steps, decoded
spans inside the document, the attention kernel and the FLOP count; and pretrained vs random weights."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from distqa.config import ConfigError
from distqa.config.sources import load_config
from distqa.distributed.precision import Precision
from distqa.distributed.runtime import local_runtime
from distqa.encoders.flops import non_embedding_parameters
from distqa.encoders.pretrained import check_sources, load_tokenizer
from distqa.encoders.template import PairTemplate
from distqa.qa.answers import Span
from distqa.qa.dummy import DummyDataset
from distqa.qa.inference import score_windows
from distqa.qa.model import build_model
from distqa.qa.nq.cache import CacheRequest, NQWindows, open_examples
from distqa.qa.nq.decode import ExampleColumns, WindowLayout, decode
from distqa.qa.nq.inference import Predictor
from distqa.qa.nq.reader import parse_example
from distqa.qa.nq.windows import Featurizer, WindowSettings, token_span_to_pieces, window_span_to_tokens
from distqa.qa.squad.cache import SquadWindows
from distqa.qa.squad.cache import open_examples as open_squad_examples
from distqa.qa.squad.inference import decode_answers
from distqa.record.rundir import prepare_run_dir
from distqa.tasks import make_task
from distqa.train import train

from support.nq_examples import check_labels_recover_the_gold
from support.qa import QA_ARGS, TinyEncoder
from support.repo import REPO_ROOT

PAIR_FORMAT = {"roberta": "<s> Q </s> </s> D </s>"}
"""What each family's tokenizer makes of a (question, document) pair; the others: [CLS] Q [SEP] D [SEP]."""
WORDPIECE = ("bert", "distilbert", "electra")
SAMPLE = REPO_ROOT / "data" / "nq-sample" / "simplified-nq-train.jsonl"
WINDOWS = ["--max-seq-len", "64", "--max-question-len", "16", "--doc-stride", "32"]


def load(*args: str):
    return load_config(list(args), environ={}, dotenv_path="/nonexistent")


def template_of(encoder: TinyEncoder) -> PairTemplate:
    return PairTemplate.of(encoder.tokenizer.backend_tokenizer)


# --- the tokenizer's own pair format ---------------------------------------------------------------

def test_windows_are_what_the_tokenizer_makes_of_the_pair(tiny_encoder: TinyEncoder) -> None:
    tokenizer, template = tiny_encoder.tokenizer, template_of(tiny_encoder)
    parts = {"prefix": template.prefix, "Q": None, "middle": template.middle, "D": None, "suffix": template.suffix}
    written = " ".join(" ".join(tokenizer.convert_ids_to_tokens(list(ids))) if ids else name
                       for name, ids in parts.items() if ids or name in "QD")
    assert written == PAIR_FORMAT.get(tiny_encoder.family, "[CLS] Q [SEP] D [SEP]")
    assert template.special_count == tokenizer.num_special_tokens_to_add(pair=True)
    # Caches of the WordPiece families keep their fingerprints (the same windows as before templates were read);
    # the others had other windows then (BERT's template, leading-space pieces dropped): theirs change.
    request = CacheRequest.from_tokenizer(SAMPLE, tokenizer, WindowSettings(64, 16, 32, 1.0, 0))
    assert ("special_ids" in request.hashed_settings()) == (tiny_encoder.family in WORDPIECE)
    # An NQ example whose document fits one window: the window is tokenizer(question, document), token types
    # included, and its label maps back to the gold answer.
    words = ["The", "old", "stone", "bridge", "crosses", "the", "river", "north", "of", "Paris", "in", "1999", "."]
    record = {"example_id": 1, "question_text": "where is the bridge", "document_text": " ".join(words),
              "long_answer_candidates": [{"start_token": 0, "end_token": len(words), "top_level": True}],
              "annotations": [{"yes_no_answer": "NONE", "short_answers": [{"start_token": 7, "end_token": 9}],
                               "long_answer": {"start_token": 0, "end_token": len(words), "candidate_index": 0}}]}
    features = Featurizer(tokenizer.backend_tokenizer, tokenizer.pad_token_id,
                          WindowSettings(64, 16, 32, 1.0, 0)).featurize([parse_example(json.dumps(record), True)])
    length, question_len = int(features.windows["length"][0]), int(features.windows["question_len"][0])
    own = tokenizer.backend_tokenizer.encode(record["question_text"], record["document_text"])
    assert features.windows["input_ids"][0][:length].tolist() == own.ids
    assert template.token_type_ids(question_len, (np.arange(64) < length).astype(int))[:length].tolist() == own.type_ids
    assert [i for i, s in enumerate(own.sequence_ids) if s == 1] == list(
        range(template.document_offset(question_len), length - len(template.suffix)))
    assert window_span_to_tokens(features.examples["piece_to_token"][0], 0, template.document_offset(question_len),
                                 int(features.windows["start_position"][0]), int(features.windows["end_position"][0])
                                 ) == Span(7, 9)


def test_the_dummy_dataset_draws_no_special_token_as_a_word(tiny_encoder: TinyEncoder) -> None:
    """RoBERTa's and DeBERTa-v3's mask token is the last id, ModernBERT's specials all come last."""
    tokenizer, template = tiny_encoder.tokenizer, template_of(tiny_encoder)
    dataset = DummyDataset.for_tokenizer(tokenizer, size=64, max_seq_len=64, max_question_len=16, seed=0)
    special = set(tokenizer.all_special_ids)
    labelled = 0
    for item in (dataset[i] for i in range(len(dataset))):
        ids, length = item["input_ids"].tolist(), int(item["attention_mask"].sum())
        positions = [i for i, token in enumerate(ids[:length]) if token in special]
        question_len = positions[len(template.prefix)] - len(template.prefix)
        begin, end = template.document_offset(question_len), length - len(template.suffix)
        assert [ids[i] for i in positions] == [*template.prefix, *template.middle, *template.suffix]
        assert positions == [*range(len(template.prefix)), *range(begin - len(template.middle), begin),
                             *range(end, length)]
        start, stop = int(item["start_positions"]), int(item["end_positions"])
        assert start == stop == 0 or begin <= start <= stop < end
        labelled += start > 0
    assert labelled > 10


def test_every_gold_answer_of_the_nq_sample_is_recovered_from_its_window_labels(tiny_encoder: TinyEncoder) -> None:
    tokenizer, template = tiny_encoder.tokenizer, template_of(tiny_encoder)
    examples = [parse_example(line, True) for line in SAMPLE.read_text().splitlines()]
    settings = WindowSettings(128, 16, 64, 1.0, 0)
    features = Featurizer(tokenizer.backend_tokenizer, tokenizer.pad_token_id, settings).featurize(examples)
    assert check_labels_recover_the_gold(examples, features, template) > 50
    # and every answer that some window must hold is labelled: one of at most room - stride + 1 pieces
    labelled = set(features.windows["example_index"][features.windows["start_position"] > 0].tolist())
    for row, example in enumerate(examples):
        room = settings.max_seq_len - features.examples["question_len"][row] - template.special_count
        pieces = [token_span_to_pieces(features.examples["piece_to_token"][row], span)
                  for span in (example.targets.label_spans if example.targets else ())]
        if any(0 <= last - first <= room - settings.doc_stride for first, last in pieces):
            assert row in labelled, example.example_id
    assert len(labelled) > 50


# --- the model ---------------------------------------------------------------------------------

def test_two_training_steps_then_decoded_spans_lie_inside_the_document(tiny_encoder: TinyEncoder, tmp_path: Path,
                                                                      no_torchrun_env: None) -> None:
    """The ``nq`` task end to end in this process: the sample featurised, 2 steps, an evaluation, best.pt; then
    the checkpoint's model over the validation windows: every candidate span inside its window's document part,
    and every decoded answer inside its document."""
    config = load(*QA_ARGS, *WINDOWS, "--task", "nq", "--model-name-or-path", str(tiny_encoder.directory),
                  "--nq-cache-dir", str(tmp_path / "cache"), "--output-dir", str(tmp_path), "--max-steps", "2",
                  "--global-batch-size", "8", "--per-rank-batch-size", "8", "--checkpoint-every", "0",
                  "--validation-fraction", "0.03", "--eval-batch-size", "64", "--device", "cpu", "--precision", "fp32")
    task = make_task(config)
    task.check_inputs(may_build=True)
    runtime = local_runtime("cpu")
    assert train(config, runtime, prepare_run_dir(config, runtime), task).step == 2

    predictor = Predictor.from_checkpoint(tmp_path / config.run_name / "checkpoints" / "best.pt", runtime)
    directory = next((tmp_path / "cache").iterdir())
    windows = NQWindows(directory, "validation")
    spans = score_windows(predictor.model, windows, runtime, Precision.choose("fp32", runtime.device), 64, 30)
    special = set(tiny_encoder.tokenizer.all_special_ids) - {tiny_encoder.tokenizer.unk_token_id}
    found = np.isfinite(spans.score)
    assert found.any()
    for window, which in zip(*np.nonzero(found), strict=True):
        start, end = int(spans.start[window, which]), int(spans.end[window, which])
        assert windows.document_begin[window] <= start <= end < windows.document_end[window]
        assert not special & set(windows[int(window)]["input_ids"][start:end + 1].tolist())
    table = open_examples(directory, "validation")
    lengths = table.column("num_tokens").to_pylist()
    for prediction, num_tokens in zip(decode(spans, WindowLayout.of(windows), ExampleColumns.of(table)), lengths,
                                      strict=True):
        assert prediction.short is None or 0 <= prediction.short.start < prediction.short.end <= num_tokens


def test_the_squad_sample_featurises_labels_its_answers_and_decodes_inside_the_context(
        tiny_encoder: TinyEncoder, tmp_path: Path) -> None:
    """The ``squad`` task over each family: the committed SQuAD v2 sample featurised through the task (the
    tokenizer's own pair encoding), every answerable question's gold text recovered from a window's labels and its
    character offsets, and a model of the family (random weights) answering every question inside its context."""
    config = load(*QA_ARGS, "--task", "squad", "--model-name-or-path", str(tiny_encoder.directory),
                  "--squad-train-file", "data/squad-sample/dev.json", "--validation-fraction", "0.5",
                  "--squad-cache-dir", str(tmp_path / "cache"), "--max-seq-len", "64", "--window-overlap", "16",
                  "--device", "cpu")
    task = make_task(config)
    task.check_inputs(may_build=True)
    directory = next((tmp_path / "cache").iterdir())
    recovered = 0
    for split in ("train", "validation"):
        windows, examples = SquadWindows(directory, split), open_squad_examples(directory, split)
        answers, contexts = examples.column("answer_text").to_pylist(), examples.column("context").to_pylist()
        offsets, columns = windows.offsets(), windows.columns
        for row in np.flatnonzero(columns["answer_type"] != 0):
            question, begin = int(columns["example_index"][row]), int(windows.document_begin[row])
            first, last = int(columns["start_position"][row]) - begin, int(columns["end_position"][row]) - begin
            characters = offsets[row] if len(offsets[row]) else None
            if characters is None:  # the training split keeps no offsets: the labels must lie in the context
                assert 0 <= first <= last < windows.document_end[row] - begin
                continue
            assert contexts[question][characters[first, 0]:characters[last, 1]].strip() in answers[question]
            recovered += 1
    assert recovered > 10
    evaluator = task.evaluator(local_runtime("cpu"))
    torch.manual_seed(0)
    model, fp32 = build_model(config).eval(), Precision.choose("fp32", torch.device("cpu"))
    evaluation = evaluator.evaluate(model, fp32)
    assert {"exact", "f1", "total"} <= set(evaluation.metrics)
    predictions = decode_answers(score_windows(model, evaluator.windows, local_runtime("cpu"), fp32, 64, 30),
                                 evaluator.windows, evaluator.examples)  # the best spans, before the threshold
    contexts = dict(zip(evaluator.examples.column("id").to_pylist(), evaluator.examples.column("context").to_pylist(),
                        strict=True))
    assert sum(bool(p.text) for p in predictions) > len(predictions) / 2
    assert all(p.text in contexts[p.id] and p.text == p.text.strip() for p in predictions)


def test_the_attention_kernel_and_the_flop_count_are_the_encoders_own(tiny_encoder: TinyEncoder,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    """SDPA where transformers has it, eager with one warning where not (DeBERTa); the FLOPs' parameter count
    equals the encoder's parameters less its embedding tables, counted from its config by hand."""
    config = load(*QA_ARGS, "--model-name-or-path", str(tiny_encoder.directory))
    with caplog.at_level(logging.INFO):
        model = build_model(config)
    assert model.uses_token_types == (tiny_encoder.family in ("bert", "electra"))  # DeBERTa-v3: type_vocab_size 0
    kernel = "eager" if tiny_encoder.family == "deberta-v3" else "sdpa"
    assert model.encoder.config._attn_implementation == kernel
    assert ("no SDPA kernel for DebertaV2Model" in caplog.text) == (kernel == "eager")
    assert "random weights: " in caplog.text and "holds a config but no weights" in caplog.text

    c = model.encoder.config
    width = getattr(c, "embedding_size", None) or c.hidden_size
    tables = c.vocab_size * width
    if tiny_encoder.family in ("bert", "electra", "roberta", "distilbert"):
        tables += c.max_position_embeddings * width + getattr(c, "type_vocab_size", 0) * width
    if tiny_encoder.family == "deberta-v3":  # relative positions, 2 × position_buckets of them
        tables += 2 * c.position_buckets * c.hidden_size
    everything = sum(p.numel() for p in model.encoder.parameters())
    assert non_embedding_parameters(model.encoder) == everything - tables > 0
    assert task_flops(model, 64) == 6 * (everything - tables) + 12 * c.num_hidden_layers * c.hidden_size * 64


def task_flops(model: nn.Module, seq_len: int) -> float | None:
    return make_task(load(*QA_ARGS)).flops_per_token(model, seq_len)


# --- pretrained or random weights ----------------------------------------------------------------

@pytest.fixture
def pretrained_dir(tmp_path: Path) -> Path:
    """The tiny BERT with weights saved: a model that has pretrained weights, as a hub download is."""
    directory = tmp_path / "pretrained"
    torch.manual_seed(0)
    build_model(load(*QA_ARGS)).encoder.save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (directory / name).write_bytes((REPO_ROOT / "data" / "tiny-bert" / name).read_bytes())
    return directory


def encoder_weights(config) -> torch.Tensor:
    torch.manual_seed(1)
    return build_model(config).encoder.embeddings.word_embeddings.weight.detach()


def test_naming_a_model_with_weights_loads_them_whatever_the_preset(pretrained_dir: Path, tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The issue's trap: the default preset (tiny-cpu, a weightless model) and --model-name-or-path of a model
    with weights trained random ones without a word."""
    expected = encoder_weights(load("--preset", "none", "--model-name-or-path", str(pretrained_dir),
                                    "--from-scratch", "false"))
    with caplog.at_level(logging.INFO):
        default_preset = load("--model-name-or-path", str(pretrained_dir))
        assert default_preset.from_scratch == "auto"
        assert torch.equal(encoder_weights(default_preset), expected)
    assert f"loaded pretrained weights from {pretrained_dir}" in caplog.text

    # A fork's preset for a weightless model says from_scratch = true: it stays with that model.
    preset = tmp_path / "fork.toml"
    preset.write_text('model_name_or_path = "data/tiny-bert"\nfrom_scratch = true\n')
    caplog.clear()
    with caplog.at_level(logging.INFO):
        config = load("--preset", str(preset), "--model-name-or-path", str(pretrained_dir))
    assert config.from_scratch == "auto" and "its from_scratch = true is for its own model" in caplog.text
    assert load("--preset", str(preset)).from_scratch is True  # with its own model it holds

    # Asked for, random weights are still there, with a warning that names what is not used.
    caplog.clear()
    with caplog.at_level(logging.INFO):
        random_weights = encoder_weights(load("--model-name-or-path", str(pretrained_dir), "--from-scratch", "true"))
    assert not torch.equal(random_weights, expected)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"random weights: from_scratch is true; the pretrained weights of {pretrained_dir} are unused"]


def test_a_weightless_model_is_random_under_auto_and_refused_under_false(tmp_path: Path) -> None:
    check_sources(load("--model-name-or-path", "data/tiny-bert"))  # auto: random weights, fine
    with pytest.raises(ConfigError, match=r"holds a config but no weights .* from_scratch is false"):
        check_sources(load("--model-name-or-path", "data/tiny-bert", "--from-scratch", "false"))
    with pytest.raises(ConfigError, match=r"from_scratch: invalid value 'maybe' .* choose one of \['auto', 'true', "
                                          r"'false'\]"):
        load("--from-scratch", "maybe")


def test_a_model_without_its_tokenizer_files_is_one_line_naming_it(tmp_path: Path) -> None:
    """A model's files without the tokenizer's (a hub cache of weights and config.json): transformers builds the
    config's tokenizer class with nothing but special tokens, which the run would meet as a traceback (the
    DummyDataset's 'needs more than 10 ids'); it is refused before, naming the folder and what is missing."""
    model = tmp_path / "weights-only"
    model.mkdir()
    shutil.copy(REPO_ROOT / "data" / "tiny-bert" / "config.json", model / "config.json")
    with pytest.raises(ConfigError) as refused:
        load_tokenizer(load("--model-name-or-path", str(model)))
    assert str(refused.value) == (
        f"model_name_or_path={str(model)!r}: {model} holds a model but no tokenizer files (tokenizer.json, or "
        "vocab.txt / spm.model): the tokenizer built from its config knows only its 5 special tokens. Put the "
        "tokenizer's files beside the model's, or name them with --tokenizer-name-or-path.")


def test_a_weightless_directory_is_a_warning_unless_random_weights_are_asked_for(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A directory of a config alone (a download that stopped after config.json) under from_scratch auto: one
    WARNING saying so and what to do. Random weights asked for (--from-scratch true), or the bundled offline model,
    which has none by design: INFO."""
    directory = tmp_path / "model"
    shutil.copytree(REPO_ROOT / "data" / "tiny-bert", directory)

    def records(*args: str) -> list[tuple[int, str]]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="distqa.encoders.pretrained"):
            build_model(load(*args))
        return [(r.levelno, r.getMessage()) for r in caplog.records if r.getMessage().startswith("random weights")]

    assert records("--model-name-or-path", str(directory)) == [(logging.WARNING, (
        f"random weights: {directory} holds a config but no weights (model.safetensors or pytorch_model.bin), so "
        "training starts from random ones. For pretrained weights give a directory that holds model.safetensors, or "
        "a hub name; if random weights are meant, pass --from-scratch true (which silences this warning)."))]
    assert records("--model-name-or-path", str(directory), "--from-scratch", "true") == [
        (logging.INFO, "random weights: from_scratch is true")]
    assert [level for level, _ in records("--model-name-or-path", "data/tiny-bert")] == [logging.INFO]


@pytest.mark.parametrize("tiny_encoder", ["roberta"], indirect=True)
def test_roberta_windows_hold_four_special_tokens_and_512_positions(tiny_encoder: TinyEncoder) -> None:
    """Refused before any process group, naming the setting: a stride that fits BERT's windows (64 - 16 - 3 = 45
    document tokens) but not RoBERTa's (44), and a window longer than roberta-base's 514 - 2 positions."""
    roberta = str(tiny_encoder.directory)
    with pytest.raises(ConfigError, match=r"doc_stride \(45\) must be between 1 and .* - 4 \(special tokens\) = 44"):
        make_task(load(*QA_ARGS, "--task", "nq", "--model-name-or-path", roberta, "--doc-stride", "45")
                  ).check_inputs(False)
    with pytest.raises(ConfigError, match=r"max_seq_len \(513\) exceeds the 512 positions of the encoder"):
        check_sources(load("--model-name-or-path", roberta, "--max-seq-len", "513", "--max-question-len", "16"))
