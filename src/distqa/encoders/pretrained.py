"""What transformers loads for us (encoder config, weights, tokenizer), with errors that say what to fix.

A model or tokenizer source is a local directory (``data/tiny-bert``, a downloaded ``bert-base-uncased``)
or a hub name. transformers reports a source it cannot load with a long ``OSError`` traceback, from inside
a rank that may already wait in a process group. :func:`check_sources` runs on every rank before any
process group exists and turns each case into one :class:`~distqa.config.ConfigError` that names the
path and the fix; the loaders below translate what is left (a hub name that does not exist). A hub name is
downloaded once per run into ``HF_HOME`` (shared storage on the platform), by global rank 0 (:func:`fetch_once`).

Pretrained or random weights (``from_scratch``, :func:`weights_choice`, logged by every rank in one line) and the
attention kernel (:func:`attention_kernel`, ``eager`` where transformers has no SDPA kernel): docs/CONFIGURATION.md,
"Another encoder".
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import huggingface_hub
from transformers import (
    MODEL_MAPPING,
    AutoConfig,
    AutoModel,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedTokenizerBase,
)
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

from distqa.config import ConfigError
from distqa.encoders.config import TINY_MODEL_DIR, EncoderConfig
from distqa.encoders.hub import cached_files, cached_snapshot, hub_cache, hub_offline, not_available

if TYPE_CHECKING:  # transformers' modeling code: seconds of imports that loading a tokenizer does not need
    from transformers import PreTrainedModel

WEIGHT_FILES = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)
"""The files ``AutoModel.from_pretrained`` reads PyTorch weights from, in a model directory."""

HUB_FILES = ["*.json", "*.txt", "*.model", "*.safetensors", "pytorch_model*.bin"]
"""What :func:`fetch_once` downloads of a hub repository: configs, tokenizer files and PyTorch weights,
not the TensorFlow, Flax, ONNX or Core ML copies many repositories also hold."""

PADDING_OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert")
"""Model types whose position ids start after the padding id (RoBERTa's ``create_position_ids_from_input_ids``):
roberta-base's 514 position embeddings hold windows of 512 tokens."""

log = logging.getLogger(__name__)
_cached: set[str] = set()  # hub names fetch_once has put into HF_HOME: loaded with local_files_only


def hub_names(config: EncoderConfig) -> list[str]:
    """The model and tokenizer sources of ``config`` that are hub names, not local directories."""
    names = [config.model_source, config.tokenizer_source]
    return [name for i, name in enumerate(names) if not Path(name).is_dir() and name not in names[:i]]


def fetch_once(config: EncoderConfig, rank: int, share: Callable[[str | None], str | None]) -> None:
    """Put the hub sources of ``config`` into the hub cache on global rank 0 only (:func:`fetch`), then every rank
    reads the cache, or every rank raises the same one-line ConfigError where rank 0 could not fetch a source.

    Call it on every rank, inside the process group, before any loader; ``share`` gives every rank rank 0's value
    (:func:`distqa.distributed.runtime.broadcast_object`). Without it every rank of every node would download the same
    files into the shared HF_HOME at once, or, without network, each would retry for a minute. Afterwards the
    loaders read the cache only (``local_files_only``); a rank whose HF_HOME is not the one rank 0 filled (a
    node-local disk) falls back to a download of its own.
    """
    names = hub_names(config)
    if not names:
        return
    failure = None
    if rank == 0:
        failure = next(filter(None, (fetch(name, _setting_of(config, name)) for name in names)), None)
    failure = share(failure)
    if failure:
        raise ConfigError(failure)
    _cached.update(names)


def fetch(name: str, setting: str) -> str | None:
    """Put the hub model ``name`` (the value of ``setting``) into the hub cache: None when it is there, else the
    one line saying why it is not (:func:`distqa.encoders.hub.not_available`).

    Offline (``HF_HUB_OFFLINE``) nothing is asked: the name must be cached (as :func:`~distqa.config.sources.
    check_environment` has checked). Otherwise ``snapshot_download`` asks the hub for its newest commit and
    downloads what the cache lacks of it; where the hub cannot be reached it returns the cached snapshot, and
    fails at once (no retries) where there is none. "downloaded" is logged only when files were."""
    cache = hub_cache()
    if hub_offline():
        if cached_snapshot(name) is None:
            return not_available(setting, name, "HF_HUB_OFFLINE is set, so nothing is downloaded")
        log.info("%s: reading %s from the hub cache %s (HF_HUB_OFFLINE)", setting, name, cache)
        return None
    before = cached_files(name)
    try:
        huggingface_hub.snapshot_download(name, allow_patterns=HUB_FILES)
    except Exception as err:  # hub errors come in many types; what to do is the same
        cause = err.__cause__ or err  # "cannot find it in the cache" wraps why the hub did not answer
        return not_available(setting, name, f"fetching it from {huggingface_hub.constants.ENDPOINT} failed "
                                            f"({type(cause).__name__}: {_first_line(cause)})")
    downloaded = len(cached_files(name) - before)
    if downloaded:
        log.info("%s: downloaded %d files of %s into the hub cache %s", setting, downloaded, name, cache)
    else:
        log.info("%s: %s is in the hub cache %s already; nothing downloaded", setting, name, cache)
    return None


def _setting_of(config: EncoderConfig, name: str) -> str:
    return "model_name_or_path" if name == config.model_source else "tokenizer_name_or_path"


def _from_pretrained(load: Callable[..., Any], settings: EncoderConfig, setting: str, source: str, what: str,
                     fix: str, /, errors: tuple[type[Exception], ...] = (OSError, ValueError), **kwargs: Any) -> Any:
    """``load(source)``: a local directory as it is; a hub name from the cache alone once it is there (put there
    by fetch_once, or by :func:`fetch` here, in a process of its own such as prepare or predict). A hub name neither
    cached nor fetched is the ConfigError of its line; a load that raises one of ``errors`` is a ConfigError naming
    ``setting`` (of ``settings``), ``what`` could not be loaded from ``source``, and the ``fix``."""
    if not Path(source).is_dir() and source not in _cached:
        failure = fetch(source, setting)
        if failure:
            raise ConfigError(failure)
        _cached.add(source)
    try:
        if source in _cached:
            try:
                return load(source, local_files_only=True, **kwargs)
            except OSError:
                log.warning("%s is not in this rank's HF_HOME; downloading it here", source)
        return load(source, **kwargs)
    except errors as err:
        raise ConfigError(f"{setting}={getattr(settings, setting)!r}: cannot load {what} from {source} "
                          f"({_first_line(err)}). {fix}") from None


def check_sources(config: EncoderConfig) -> PreTrainedTokenizerBase | None:
    """Raise ConfigError unless the encoder config, the weights (unless ``from_scratch``) and the
    tokenizer of ``config`` load. Local sources are checked whole; a hub name is checked when loaded,
    after :func:`fetch_once` (asking the hub here would be one request per rank).

    Returns the tokenizer when it is local (loading it is its check, so the caller need not load it
    again), None for a hub name."""
    model_dir = Path(config.model_source)
    if model_dir.is_dir():
        load_encoder_config(config)
        if config.from_scratch is False and not has_weights(model_dir):
            raise ConfigError(
                f"model_name_or_path={config.model_name_or_path!r}: {model_dir} holds a config but no weights "
                f"({' or '.join(WEIGHT_FILES[::2])}) and from_scratch is false. Train from random weights with "
                "--from-scratch true, give a hub name (e.g. bert-base-uncased), or put the pretrained weights "
                f"into {model_dir}.")
    return load_tokenizer(config) if Path(config.tokenizer_source).is_dir() else None


def load_encoder_config(config: EncoderConfig) -> PretrainedConfig:
    """The encoder's config, checked against the window length of ``config`` where its task has one."""
    encoder_config = _from_pretrained(
        AutoConfig.from_pretrained, config, "model_name_or_path", config.model_source, "an encoder config",
        "Give a directory holding config.json (and weights, or --from-scratch true) or a hub name such as "
        "bert-base-uncased.")
    positions = encoder_config.max_position_embeddings
    if encoder_config.model_type in PADDING_OFFSET_POSITIONS:  # positions count from pad_token_id + 1
        positions -= encoder_config.pad_token_id + 1
    # A task of windows (QAConfig and its kind) sets max_seq_len; an encoder task without it has no length to check.
    max_seq_len = getattr(config, "max_seq_len", None)
    if max_seq_len is not None and max_seq_len > positions:
        raise ConfigError(f"max_seq_len ({max_seq_len}) exceeds the {positions} positions of the encoder "
                          f"(max_position_embeddings {encoder_config.max_position_embeddings}); lower max_seq_len.")
    return encoder_config


def has_weights(model_dir: Path) -> bool:
    """Whether a local model directory holds PyTorch weights that ``from_pretrained`` reads."""
    return any((model_dir / name).is_file() for name in WEIGHT_FILES)


def weights_choice(config: EncoderConfig) -> tuple[bool, str]:
    """Whether the encoder of ``config`` starts from its pretrained weights, and, where it does not, why (for
    the log). A hub name is taken to have weights (its load says so otherwise, naming --from-scratch true)."""
    model_dir = Path(config.model_source)
    local_without_weights = model_dir.is_dir() and not has_weights(model_dir)
    if config.from_scratch is True:
        unused = "" if local_without_weights else f"; the pretrained weights of {config.model_name_or_path} are unused"
        return False, f"from_scratch is true{unused}"
    if config.from_scratch == "auto" and local_without_weights:
        return False, (f"{config.model_name_or_path} holds a config but no weights ({' or '.join(WEIGHT_FILES[::2])}), "
                       "and from_scratch is auto")
    return True, ""


def attention_kernel(config: EncoderConfig, encoder_config: PretrainedConfig) -> str:
    """``config.attn_implementation``, or ``eager`` (with one warning) where transformers has no SDPA kernel for
    this encoder. transformers says so with a plain ValueError (``_sdpa_can_dispatch``), the type of every other
    load error; so the model class is asked first (its ``_supports_sdpa``), and no message is read."""
    if config.attn_implementation != "sdpa" or type(encoder_config) not in MODEL_MAPPING:
        return config.attn_implementation  # a config AutoModel does not know: its own error names it
    model_class = MODEL_MAPPING[type(encoder_config)]
    if model_class._supports_sdpa:
        return "sdpa"
    log.warning("attn_implementation: transformers has no SDPA kernel for %s (%s); using 'eager' (set "
                "--attn-implementation eager to say so)", model_class.__name__, config.model_name_or_path)
    return "eager"


def load_encoder(config: EncoderConfig, encoder_config: PretrainedConfig, weights_from_checkpoint: bool = False
                 ) -> PreTrainedModel:
    """The pretrained weights, or random ones (:func:`weights_choice`, logged in one line), with the attention
    kernel of :func:`attention_kernel`. ``weights_from_checkpoint``: random ones that the caller replaces at once
    with a checkpoint's (``predict``), said by the caller."""
    attention = {"attn_implementation": attention_kernel(config, encoder_config)}
    pretrained, why_not = weights_choice(config)
    if weights_from_checkpoint or not pretrained:
        if not weights_from_checkpoint:
            _say_random_weights(config, why_not)
        return AutoModel.from_config(encoder_config, **attention)
    encoder = _from_pretrained(
        AutoModel.from_pretrained, config, "model_name_or_path", config.model_source, "pretrained weights",
        "Use --from-scratch true for random weights, a hub name such as bert-base-uncased, or a directory holding "
        "config.json and model.safetensors.", config=encoder_config, **attention)
    log.info("loaded pretrained weights from %s", config.model_source)
    return encoder


def _say_random_weights(config: EncoderConfig, why: str) -> None:
    """One line on why the encoder starts from random weights. A WARNING where that may be a mistake: pretrained
    weights left unused, or a directory that lacks them (a download that stopped after config.json) under
    from_scratch auto, unless it is the bundled offline model, which has none by design. INFO where it was asked
    for (from_scratch true on a directory without weights)."""
    model_dir = Path(config.model_source)
    if config.from_scratch is True:
        asked_for_nothing_lost = model_dir.is_dir() and not has_weights(model_dir)
        (log.info if asked_for_nothing_lost else log.warning)("random weights: %s", why)
    elif model_dir.resolve() == TINY_MODEL_DIR.resolve():
        log.info("random weights: %s", why)
    else:
        log.warning("random weights: %s holds a config but no weights (%s), so training starts from random "
                    "ones. For pretrained weights give a directory that holds model.safetensors, or a hub name; "
                    "if random weights are meant, pass --from-scratch true (which silences this warning).",
                    config.model_name_or_path, " or ".join(WEIGHT_FILES[::2]))


def load_tokenizer(config: EncoderConfig) -> PreTrainedTokenizerBase:
    name = "tokenizer_name_or_path" if config.tokenizer_name_or_path else "model_name_or_path"
    tokenizer = _from_pretrained(
        AutoTokenizer.from_pretrained, config, name, config.tokenizer_source, "a tokenizer",
        "Give a directory holding tokenizer.json (as data/tiny-bert does) or a hub name such as bert-base-uncased.",
        errors=(OSError, ValueError, TypeError))
    if len(tokenizer) <= len(tokenizer.all_special_tokens):
        # A model's files without the tokenizer's (weights and config.json alone): transformers builds the class the
        # config names with no vocabulary, which knows nothing but its special tokens.
        raise ConfigError(
            f"{name}={getattr(config, name)!r}: {config.tokenizer_source} holds a model but no tokenizer files "
            f"(tokenizer.json, or vocab.txt / spm.model): the tokenizer built from its config knows only its "
            f"{len(tokenizer)} special tokens. Put the tokenizer's files beside the model's, or name them with "
            "--tokenizer-name-or-path.")
    return tokenizer


def _first_line(err: Exception) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__
