"""A trained QA model as a Hugging Face directory, and back: what ``python -m distqa.export`` writes and what
``predict --checkpoint DIR`` reads.

The directory is what ``transformers`` loads offline as ``AutoModelForQuestionAnswering.from_pretrained(DIR)``
and ``pipeline("question-answering", model=DIR)`` serves:

- ``config.json`` and ``model.safetensors``: the encoder with transformers' own question-answering head of its
  family (``BertForQuestionAnswering``, ``RobertaForQuestionAnswering``, …). Our span head becomes that head's
  ``qa_outputs`` with a zero bias: :class:`~distqa.qa.model.QAModel`'s span head has no bias, and a constant added
  to every position's logit changes no softmax over positions, so the logits are ours exactly;
- the tokenizer files (``tokenizer.json``, ``tokenizer_config.json``, …), so nothing else is needed;
- what transformers has no place for, beside them: ``distqa_heads.safetensors`` (the answer-type head) and
  ``distqa.json`` (the run's config, the task's inference state, e.g. NQ's decoding thresholds, the validation
  metrics and the versions). With those, :func:`load_model_checkpoint` gives back the
  :class:`~distqa.checkpoint.format.ModelCheckpoint` that ``best.pt`` holds, so predict writes the same file from both.

An encoder family whose question-answering class has no ``qa_outputs`` (ModernBERT puts a dense layer and a
norm before its classifier) cannot hold our heads; export refuses it in one line.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Mapping
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForQuestionAnswering, PreTrainedModel

from distqa.checkpoint.commands import (
    RUN_FILE,  # the run's config, inference state and metrics: the commands read its task
)
from distqa.checkpoint.format import (
    FORMAT_VERSION,
    CheckpointError,
    ModelCheckpoint,
    Progress,
    is_sharded_checkpoint,
    load_checkpoint,
)
from distqa.checkpoint.sharded import load_sharded
from distqa.config import ConfigError
from distqa.config.sources import saved_config
from distqa.encoders.pretrained import load_tokenizer
from distqa.qa.config import QAConfig
from distqa.qa.model import QAModel, build_model

log = logging.getLogger(__name__)

EXTRA_HEADS = "distqa_heads.safetensors"
"""The heads transformers' question-answering classes have no place for (the answer-type head)."""


def export_model(checkpoint: ModelCheckpoint, output: Path) -> Path:
    """Write ``checkpoint``'s model as a Hugging Face directory at ``output`` (which must not exist, or be empty).

    Written into a temporary sibling and renamed at the end, so an interrupted export leaves no half directory."""
    config = _qa_config(checkpoint.config)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ConfigError(f"--output {output} exists and is not an empty directory; choose a new one (an export "
                          "never overwrites).")
    # A plain transformers model: padded attention and the encoder's own attention dropout, whatever --unpad was.
    model = build_model(replace(config, unpad=False), weights_from_checkpoint=True)
    model.load_state_dict(checkpoint.model)
    hf_model = _hf_question_answering(model)
    staging = output.with_name(f".{output.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        hf_model.save_pretrained(staging)
        load_tokenizer(config).save_pretrained(staging)
        _readable_by_transformers_4(staging / "tokenizer_config.json")
        save_file({f"answer_type_head.{name}": tensor.contiguous() for name, tensor in
                   model.answer_type_head.state_dict().items()}, staging / EXTRA_HEADS)
        run = {"format_version": FORMAT_VERSION, "config": checkpoint.config, "task_state": checkpoint.task_state,
               "evaluation": checkpoint.evaluation, "progress": asdict(checkpoint.progress),
               "versions": checkpoint.versions}
        try:
            text = json.dumps(run, indent=2, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"the checkpoint's task state or metrics are not plain JSON values ({err}); a task's "
                              "Evaluation.state must be numbers, strings, lists and dicts to be exported.") from None
        (staging / RUN_FILE).write_text(text + "\n")
        if output.exists():
            output.rmdir()
        os.replace(staging, output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return output


def _readable_by_transformers_4(tokenizer_config: Path) -> None:
    """Write ``tokenizer_config.json`` as transformers 4 reads it too; transformers 5 reads it the same.

    - transformers 5's generic tokenizer class (``TokenizersBackend``, over ``tokenizer.json``) becomes the name
      transformers 4 knows it by, ``PreTrainedTokenizerFast``; both versions read that name;
    - transformers 5 writes a tokenizer's additional special tokens as a list under ``extra_special_tokens``
      (DeBERTa-v3's tokenizer has some), where transformers 4 (4.57) expects a dict of named tokens and fails to
      build the tokenizer at all (``AutoTokenizer`` raises; ``pipeline`` then reports a missing tokenizer). The list
      goes back under its transformers 4 name, ``additional_special_tokens``, which transformers 5 reads as
      ``extra_special_tokens`` (``PreTrainedTokenizerBase.from_pretrained``: "Convert deprecated
      additional_special_tokens"; where both are given it takes ``extra_special_tokens``, so this list).

    transformers 5 removed the question-answering pipeline, so ``pipeline("question-answering", model=DIR)`` runs
    under transformers 4."""
    settings = json.loads(tokenizer_config.read_text())
    if settings.get("tokenizer_class") == "TokenizersBackend":
        settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    if isinstance(settings.get("extra_special_tokens"), list):
        settings["additional_special_tokens"] = settings.pop("extra_special_tokens")
    tokenizer_config.write_text(json.dumps(settings, indent=2) + "\n")


def _hf_question_answering(model: QAModel) -> PreTrainedModel:
    """transformers' question-answering model of the encoder's family, holding our encoder and span head."""
    encoder = model.encoder
    hf_model = AutoModelForQuestionAnswering.from_config(encoder.config)
    head = getattr(hf_model, "qa_outputs", None)
    if not isinstance(head, torch.nn.Linear) or head.weight.shape != model.span_head.weight.shape:
        raise ConfigError(f"cannot export a {type(encoder).__name__}: transformers' {type(hf_model).__name__} has no "
                          "qa_outputs layer that our span head can become (it puts other layers before its "
                          "classifier). Use predict with best.pt for this encoder.")
    missing, unexpected = hf_model.base_model.load_state_dict(encoder.state_dict(), strict=False)
    if missing or unexpected:  # a family whose base model differs from the encoder we trained
        raise ConfigError(f"cannot export a {type(encoder).__name__}: transformers' {type(hf_model).__name__} "
                          f"expects other encoder weights (missing {missing[:3]}, unexpected {unexpected[:3]}).")
    with torch.no_grad():
        head.weight.copy_(model.span_head.weight)
        head.bias.zero_()
    return hf_model


def load_model_checkpoint(path: Path) -> ModelCheckpoint:
    """``best.pt`` or a ``step-*.pt`` (:func:`~distqa.checkpoint.format.load_checkpoint`), a sharded ``step-*.dcp``
    (:func:`~distqa.checkpoint.sharded.load_sharded`, whole weights in this process), or a directory written by
    :func:`export_model`, as the :class:`~distqa.checkpoint.format.ModelCheckpoint` it holds. An exported directory's
    config names the directory as the model and tokenizer source, so nothing else is read."""
    if is_sharded_checkpoint(path):
        try:
            return load_sharded(path)
        except CheckpointError as err:
            raise ConfigError(str(err)) from None
    if path.is_dir():
        return _read_export(path)
    if not path.is_file():
        raise ConfigError(f"checkpoint {path} does not exist; train first (see the README) or pass "
                          "results/<run>/checkpoints/best.pt or a directory written by python -m distqa.export")
    try:
        return load_checkpoint(path, ModelCheckpoint)
    except CheckpointError as err:
        raise ConfigError(str(err)) from None


def _read_export(directory: Path) -> ModelCheckpoint:
    run_file = directory / RUN_FILE
    if not run_file.is_file():
        raise ConfigError(f"{directory} is a directory without {RUN_FILE}: not one written by python -m "
                          "distqa.export (a plain transformers model has no answer-type head and no thresholds).")
    try:
        run = json.loads(run_file.read_text())
        if run.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"format version {run.get('format_version')}, this distqa reads {FORMAT_VERSION}")
        source = str(directory.resolve())
        config = {**run["config"], "model_name_or_path": source, "tokenizer_name_or_path": source}
        qa_config = _qa_config(config)
        hf_model = AutoModelForQuestionAnswering.from_pretrained(source, local_files_only=True)
        heads = load_file(directory / EXTRA_HEADS)
        progress = Progress(**run["progress"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{directory} is not a readable export ({type(err).__name__}: {err}); export the "
                          "checkpoint again with python -m distqa.export.") from None
    state = {f"encoder.{name}": tensor for name, tensor in hf_model.base_model.state_dict().items()}
    # qa_outputs' bias is dropped: our span head has none, and a constant on every position changes no answer.
    state["span_head.weight"] = hf_model.qa_outputs.weight.detach()
    state.update(heads)
    model = build_model(qa_config, weights_from_checkpoint=True)
    model.load_state_dict(state)  # checks that every weight is there, and nothing else
    return ModelCheckpoint(model=model.state_dict(), config=config, task_state=run["task_state"],
                           evaluation=run["evaluation"], progress=progress, versions=run["versions"])


def _qa_config(values: Mapping[str, Any]) -> QAConfig:
    config = saved_config(values)
    if not isinstance(config, QAConfig):
        raise ConfigError(f"task {config.task!r} is not a question-answering task with a transformers encoder; only "
                          "those export to a Hugging Face question-answering directory.")
    return config
