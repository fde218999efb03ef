"""What transformers loads for us (encoder config, weights, tokenizer), with errors that say what to fix.

A model or tokenizer source is a local directory (``data/tiny-bert``, a downloaded ``bert-base-uncased``)
or a hub name. transformers reports a source it cannot load with a long ``OSError`` traceback, from inside
a rank that may already wait in a process group. :func:`check_sources` runs on every rank before any
process group exists and turns each case into one :class:`~distqa.config.ConfigError` that names the
path and the fix; the loaders below translate what is left (a hub name that does not exist).
"""

from __future__ import annotations

from pathlib import Path

from transformers import (
    AutoConfig,
    AutoModel,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

from distqa.config import Config, ConfigError

WEIGHT_FILES = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)
"""The files ``AutoModel.from_pretrained`` reads PyTorch weights from, in a model directory."""


def check_sources(config: Config) -> None:
    """Raise ConfigError unless the encoder config, the weights (unless ``from_scratch``) and the
    tokenizer of ``config`` load. Local sources are checked whole; a hub name is checked when loaded."""
    load_encoder_config(config)
    model_dir = Path(config.model_source)
    if not config.from_scratch and model_dir.is_dir() and not any((model_dir / f).is_file() for f in WEIGHT_FILES):
        raise ConfigError(
            f"model_name_or_path={config.model_name_or_path!r}: {model_dir} holds a config but no weights "
            f"({' or '.join(WEIGHT_FILES[::2])}) and from_scratch is false. Train from random weights with "
            "--from-scratch true, give a hub name (e.g. bert-base-uncased), or put the pretrained weights "
            f"into {model_dir}.")
    if Path(config.tokenizer_source).is_dir():
        load_tokenizer(config)


def load_encoder_config(config: Config) -> PretrainedConfig:
    """The encoder's config, checked against the window length of ``config``."""
    try:
        encoder_config = AutoConfig.from_pretrained(config.model_source)
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"model_name_or_path={config.model_name_or_path!r}: cannot load an encoder config from "
            f"{config.model_source} ({_first_line(err)}). Give a directory holding config.json (and weights, "
            "or --from-scratch true) or a hub name such as bert-base-uncased.") from None
    if config.max_seq_len > encoder_config.max_position_embeddings:
        raise ConfigError(f"max_seq_len ({config.max_seq_len}) exceeds the encoder's max_position_embeddings "
                          f"({encoder_config.max_position_embeddings}); lower max_seq_len.")
    return encoder_config


def load_encoder(config: Config, encoder_config: PretrainedConfig) -> PreTrainedModel:
    """The pretrained weights, or random ones with ``from_scratch``."""
    if config.from_scratch:
        return AutoModel.from_config(encoder_config)
    try:
        return AutoModel.from_pretrained(config.model_source, config=encoder_config)
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"model_name_or_path={config.model_name_or_path!r}: cannot load pretrained weights from "
            f"{config.model_source} ({_first_line(err)}). Use --from-scratch true for random weights, a hub "
            "name such as bert-base-uncased, or a directory holding config.json and model.safetensors.") from None


def load_tokenizer(config: Config) -> PreTrainedTokenizerBase:
    name = "tokenizer_name_or_path" if config.tokenizer_name_or_path else "model_name_or_path"
    try:
        return AutoTokenizer.from_pretrained(config.tokenizer_source)
    except (OSError, ValueError, TypeError) as err:
        raise ConfigError(
            f"{name}={getattr(config, name)!r}: cannot load a tokenizer from {config.tokenizer_source} "
            f"({_first_line(err)}). Give a directory holding tokenizer.json (as data/tiny-bert does) or a hub "
            "name such as bert-base-uncased.") from None


def _first_line(err: Exception) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__
