"""The QA model: a transformers encoder + a start/end span head + a 5-way answer-type head, and its loss."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from distqa.config import ConfigError
from distqa.encoders.pretrained import load_encoder, load_encoder_config
from distqa.encoders.varlen import VARLEN_ATTENTION, pad_back, supports_varlen, unpad
from distqa.qa.answers import AnswerType
from distqa.qa.collate import INPUT_NAMES
from distqa.qa.config import QAConfig

log = logging.getLogger(__name__)

# Attribute names of the dropout probabilities across BERT-family configs (BERT/RoBERTa/ELECTRA use
# hidden_dropout_prob and attention_probs_dropout_prob, DistilBERT dropout and attention_dropout).
ATTENTION_DROPOUT_ATTRIBUTES = ("attention_probs_dropout_prob", "attention_dropout")
DROPOUT_ATTRIBUTES = ("hidden_dropout_prob", "dropout", *ATTENTION_DROPOUT_ATTRIBUTES)


class QAOutput(NamedTuple):
    start_logits: torch.Tensor
    """(batch, seq_len) score of each token being the first of the answer; [CLS] = no answer."""
    end_logits: torch.Tensor
    """(batch, seq_len) score of each token being the last of the answer."""
    answer_type_logits: torch.Tensor
    """(batch, 5) scores of :class:`~distqa.qa.answers.AnswerType`."""


class QAModel(nn.Module):
    """``unpad``: the encoder runs on the real tokens of a padded batch only (:mod:`distqa.encoders.varlen`; the
    encoder's attention is then :data:`~distqa.encoders.varlen.VARLEN_ATTENTION`); the heads read the same
    ``[batch, seq_len, hidden]`` either way."""

    def __init__(self, encoder: PreTrainedModel, unpad: bool = False) -> None:
        super().__init__()
        # A pooler is unused here (the type head reads [CLS] directly); unused parameters would make
        # DDP with find_unused_parameters=False fail, and cost memory and optimizer time.
        if getattr(encoder, "pooler", None) is not None:
            encoder.pooler = None
        self.encoder = encoder
        hidden = encoder.config.hidden_size
        # No bias on the span head: it would add one constant to every position's logit, which the
        # softmax over positions cancels — a parameter with no gradient but float noise for Adam to amplify.
        self.span_head = nn.Linear(hidden, 2, bias=False)
        self.answer_type_head = nn.Linear(hidden, len(AnswerType))
        std = getattr(encoder.config, "initializer_range", 0.02)
        nn.init.normal_(self.span_head.weight, std=std)
        nn.init.normal_(self.answer_type_head.weight, std=std)
        nn.init.zeros_(self.answer_type_head.bias)
        # Segment ids only go to encoders with more than one segment embedding: DistilBERT rejects
        # token_type_ids, and RoBERTa accepts them but has a single segment (id 1 would be out of range).
        self.uses_token_types = ("token_type_ids" in inspect.signature(encoder.forward).parameters
                                 and getattr(encoder.config, "type_vocab_size", 0) > 1)
        self.unpad = unpad
        # RoBERTa-family embeddings number a window's positions from padding id + 1, not 0
        # (their create_position_ids_from_input_ids); explicit position_ids must do the same.
        embeddings = getattr(encoder, "embeddings", None)
        self.first_position = (embeddings.padding_idx + 1
                               if hasattr(embeddings, "create_position_ids_from_input_ids") else 0)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> QAOutput:
        token_types = token_type_ids if self.uses_token_types else None
        if self.unpad and not bool(attention_mask.all()):
            row = unpad(input_ids, attention_mask, token_types, self.first_position)
            hidden = self.encoder(**row.inputs, attention_mask=None, **row.attention_kwargs()).last_hidden_state
            hidden = pad_back(hidden, row.indices, input_ids.shape)
        else:
            inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
            if token_types is not None:
                inputs["token_type_ids"] = token_types
            hidden = self.encoder(**inputs).last_hidden_state
        start_logits, end_logits = self.span_head(hidden).unbind(dim=-1)
        return QAOutput(start_logits, end_logits, self.answer_type_head(hidden[:, 0]))


def forward(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> QAOutput:
    """``model`` (a :class:`QAModel`, DDP-wrapped or not) on the inputs of a batch already on its device."""
    return model(**{name: batch[name] for name in INPUT_NAMES})


def qa_loss(output: QAOutput, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean of the start, end and answer-type cross-entropies (as in the BERT baseline for NQ).

    Windows without an answer have start = end = 0 ([CLS]), which is never padding, so every target
    is a valid class and the loss stays finite even when a whole batch has no answer. Padding
    positions are masked out of the span softmax; logits are upcast so bf16/fp16 cannot overflow.
    """
    padding = batch["attention_mask"] == 0
    losses = []
    for logits, target in ((output.start_logits, batch["start_positions"]),
                           (output.end_logits, batch["end_positions"])):
        logits = logits.float().masked_fill(padding, torch.finfo(torch.float32).min)
        losses.append(F.cross_entropy(logits, target))
    losses.append(F.cross_entropy(output.answer_type_logits.float(), batch["answer_type"]))
    return sum(losses) / len(losses)


LAYER_LISTS = ("encoder.layer", "transformer.layer", "layers")
"""Where each encoder family keeps its transformer layers: BERT, RoBERTa, XLM-R, ELECTRA, DeBERTa; DistilBERT;
ModernBERT."""


def transformer_layers(model: QAModel) -> list[nn.Module]:
    """The encoder's transformer layers, in order: the sharding units of a QA model (``data_parallel = fsdp``);
    the embeddings and the heads stay with the root."""
    for path in LAYER_LISTS:
        try:
            return list(model.encoder.get_submodule(path))
        except AttributeError:
            continue
    raise ConfigError(f"data_parallel: transformers' {type(model.encoder).__name__} keeps its layers in none of "
                      f"{', '.join(LAYER_LISTS)}; add its path to distqa.qa.model.LAYER_LISTS, or use "
                      "data_parallel=ddp.")


def build_model(config: QAConfig, weights_from_checkpoint: bool = False) -> QAModel:
    """Encoder from any name or directory of the encoder families (pretrained or random weights by
    ``from_scratch``); ``weights_from_checkpoint``: random ones that the caller replaces with a checkpoint's."""
    encoder_config = load_encoder_config(config)
    if config.dropout is not None:
        for name in DROPOUT_ATTRIBUTES:
            if hasattr(encoder_config, name):
                setattr(encoder_config, name, config.dropout)
    if config.unpad:
        for name in ATTENTION_DROPOUT_ATTRIBUTES:  # the varlen kernels have no dropout (the setting's help says so)
            if hasattr(encoder_config, name):
                setattr(encoder_config, name, 0.0)
    encoder = load_encoder(config, encoder_config, weights_from_checkpoint)
    if config.unpad:
        if not supports_varlen(encoder):
            raise ConfigError(f"unpad: transformers' {type(encoder).__name__} ({config.model_name_or_path}) computes "
                              "its own attention, which cannot take variable-length windows; turn the setting off "
                              "for this encoder (--unpad false).")
        encoder.set_attn_implementation(VARLEN_ATTENTION)
        log.info("unpad: the encoder runs on the windows' real tokens only (attention %r, no attention dropout)",
                 VARLEN_ATTENTION)
    if config.activation_checkpointing:
        if not encoder.supports_gradient_checkpointing:
            raise ConfigError(f"activation_checkpointing: transformers' {type(encoder).__name__} cannot recompute its "
                              "layers; turn the setting off for this encoder.")
        # Non-reentrant: the reentrant kind breaks DDP ("Expected to mark a variable ready only once",
        # transformers#23018) and torch.compile; this one also replays the layer's dropout masks exactly.
        encoder.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        encoder.config.use_cache = False  # an encoder caches no keys; said here, transformers does not warn of it
    return QAModel(encoder, unpad=config.unpad)
