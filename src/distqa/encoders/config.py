"""The settings of a run whose model is a ``transformers`` encoder: :class:`EncoderConfig`, its sections
(``ENCODER``; the encoder's fields of the generic ``MODEL``) and the offline tiny model it defaults to.

Free of torch, like :mod:`distqa.config`. The machinery knows none of this: the encoder's special cases of
where settings come from and what the machine must provide are this class's overrides of the hooks of
:class:`~distqa.config.Config` (:meth:`EncoderConfig.settle_sources`, :meth:`EncoderConfig.check_machine`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from distqa.config import MODEL, REPO_ROOT, Config, ConfigError, Section, fields_of, require_existing, resolve_path
from distqa.encoders.hub import cached_snapshot, hub_offline, not_available

log = logging.getLogger(__name__)

TINY_MODEL_DIR = REPO_ROOT / "data" / "tiny-bert"
"""The offline tiny model (a BERT config and a WordPiece tokenizer, no weights): every default runs offline."""

ENCODER = Section("encoder", "encoder and tokenizer")

HUB_HINT = ("pass an existing directory, or a hub name such as bert-base-uncased (downloaded on first use; with "
            "HF_HUB_OFFLINE=1, from the hub cache in HF_HOME)")


@dataclass
class EncoderConfig(Config):
    """A run whose model is a ``transformers`` encoder, from a local directory or the hub."""

    # --- encoder and tokenizer ---------------------------------------------------------------------
    model_name_or_path: str = ENCODER(
        str(TINY_MODEL_DIR.relative_to(REPO_ROOT)),
        "transformers encoder: a local directory or a hub name such as bert-base-uncased "
        "(hub names need network on first use). Relative paths are relative to the repository.", defines_run=True)
    tokenizer_name_or_path: str = ENCODER(
        "", "Tokenizer directory or hub name; empty means the same as model_name_or_path.")

    # --- model -------------------------------------------------------------------------------------
    from_scratch: Literal["auto", True, False] = MODEL(
        "auto", "Random encoder weights instead of the pretrained ones. auto: pretrained weights where "
        "model_name_or_path has them, random ones where it has none (a directory of a config alone, such as the "
        "offline data/tiny-bert); true: random even where there are pretrained weights; false: pretrained weights "
        "or a configuration error. The log says which. A preset's true applies to the preset's own model only.")
    dropout: float | None = MODEL(
        None, "Override the encoder's hidden and attention dropout (0 <= p < 1); none keeps the "
        "model's own.")
    attn_implementation: Literal["sdpa", "eager"] = MODEL(
        "sdpa", "The encoder's attention kernel: 'sdpa' is torch's scaled_dot_product_attention (FlashAttention "
        "or cuDNN kernels on GPUs, no seq × seq matrix in memory); 'eager' the reference matmul-softmax-matmul.")
    activation_checkpointing: bool = MODEL(
        False, "Keep only each encoder layer's input in the forward and recompute the layer in the backward "
        "(non-reentrant torch.utils.checkpoint, through the encoder's gradient_checkpointing_enable): far less "
        "activation memory for about a third more compute, for large encoders at long sequences. Same results.")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise ConfigError(f"dropout must be in [0, 1) or none, got {self.dropout}.")

    @property
    def model_source(self) -> str:
        """What to hand to ``from_pretrained``: a resolved local directory or a hub name."""
        return _local_or_hub(self.model_name_or_path)

    @property
    def tokenizer_source(self) -> str:
        return _local_or_hub(self.tokenizer_name_or_path or self.model_name_or_path)

    @classmethod
    def settle_sources(cls, values: dict[str, Any], set_later: set[str], preset_values: Mapping[str, Any],
                       preset_path: Path | None) -> None:
        """A preset's ``from_scratch = true`` is for the preset's own model (a weightless one, such as the tiny
        model's): when the environment or a flag names another model and says nothing of from_scratch, it becomes
        ``auto`` again, with a notice, so naming a pretrained model never trains random weights unasked."""
        super().settle_sources(values, set_later, preset_values, preset_path)
        if values.get("from_scratch") is not True or "from_scratch" in set_later \
                or "model_name_or_path" not in set_later:
            return
        preset_model = preset_values.get("model_name_or_path", fields_of(cls)["model_name_or_path"].default)
        if values["model_name_or_path"] == preset_model:
            return
        log.warning("preset %s: its from_scratch = true is for its own model (%s), not for %s: from_scratch is "
                    "auto (pretrained weights where the model has them); set --from-scratch true for random weights",
                    preset_path, preset_model, values["model_name_or_path"])
        values["from_scratch"] = "auto"

    def check_machine(self) -> None:
        """Local model and tokenizer paths that exist, and, while ``HF_HUB_OFFLINE`` is set, hub names only from
        the hub cache (:mod:`distqa.encoders.hub`): what ``from_pretrained`` would refuse, said before any run."""
        super().check_machine()
        for name in ("model_name_or_path", "tokenizer_name_or_path"):
            value = getattr(self, name)
            if value and _looks_local(value):
                require_existing(resolve_path(value), name, HUB_HINT)
            elif value and hub_offline() and cached_snapshot(value) is None:
                raise ConfigError(not_available(name, value, "HF_HUB_OFFLINE is set, so nothing is downloaded"))


def _local_or_hub(name: str) -> str:
    path = resolve_path(name)
    return str(path) if path.exists() else name


def _looks_local(name: str) -> bool:
    """A name whose first path component exists here is meant as a local path (data/tiny-bert);
    hub names (bert-base-uncased, google/bert_uncased_L-2_H-128_A-2) have no such directory."""
    first = Path(name).parts[0] if Path(name).parts else name
    return name.startswith(("/", ".", "~")) or any(
        (base / first).exists() for base in (Path.cwd(), REPO_ROOT))
