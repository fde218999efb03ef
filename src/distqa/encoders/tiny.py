"""Build a tiny model directory of an encoder family: a tokenizer trained on bundled text + a small config.

Every default path of this recipe runs without network access, so the default "model" is a directory
that ``transformers`` loads like any hub model, but whose tokenizer was trained here with the
``tokenizers`` library on ``data/tokenizer-corpus.txt`` and whose encoder has no weights (random ones:
``from_scratch`` auto). The BERT one is committed under ``data/tiny-bert`` and is the reference: the
trainer breaks merge ties in no fixed order, so a rebuild gives an equivalent but not byte-identical
vocabulary. Rebuild it with::

    python -m distqa.encoders.tiny --corpus data/tokenizer-corpus.txt --output data/tiny-bert

The other families (:data:`FAMILIES`) are built the same way, each with its tokenizer's kind, the
family's real special tokens at their real places and its pair template, and the family's config class at
tiny sizes; the tests build them into a temporary folder (``tests/qa/test_encoders.py``)::

    python -m distqa.encoders.tiny --family roberta --output /tmp/tiny-roberta

=========== ======================================== ===================================================
family      tokenizer (as the hub's)                 pair template, special tokens
=========== ======================================== ===================================================
bert        WordPiece, tokenizer.json                ``[CLS] q [SEP] d [SEP]``, types 0/1; specials first
distilbert  the same, DistilBertTokenizer            the same; the model takes no token types
electra     the same, BertTokenizer                  the same; embeddings narrower than the layers
roberta     byte-level BPE, RobertaTokenizer         ``<s> q </s></s> d </s>``; ``<mask>`` the last id
deberta-v3  Unigram ``spm.model`` alone (needs       ``[CLS] q [SEP] d [SEP]``; ``[MASK]`` the last id;
            sentencepiece and protobuf to load)      no token types (type_vocab_size 0); no SDPA kernel
modernbert  byte-level BPE, tokenizer.json           ``[CLS] q [SEP] d [SEP]``; every special at the end
=========== ======================================== ===================================================
"""

from __future__ import annotations

import argparse
import functools
import json
import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sentencepiece
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    AutoTokenizer,
    BertConfig,
    DebertaV2Config,
    DistilBertConfig,
    ElectraConfig,
    ModernBertConfig,
    PretrainedConfig,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    RobertaConfig,
)

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
BERT_TEMPLATE = {"single": "[CLS] $A [SEP]", "pair": "[CLS] $A [SEP] $B:1 [SEP]:1"}
LAYERS = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512}
"""Two layers of width 128: fast on a laptop CPU, the same code paths as the base models."""


def train_tokenizer(corpus: Path, vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """A lower-casing BERT WordPiece tokenizer; printable ASCII is always in the vocabulary, so
    unseen English words split into pieces instead of becoming [UNK]."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, min_frequency=1,
        initial_alphabet=sorted(set(string.printable.lower()) - set(string.whitespace)),
    )
    tokenizer.train([str(corpus)], trainer)
    tokenizer.post_processor = _template(tokenizer, BERT_TEMPLATE)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]", model_max_length=512,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def build_tiny_model_dir(corpus: Path, output: Path) -> Path:
    """The tiny BERT (``data/tiny-bert``)."""
    return build_family_dir("bert", corpus, output)


# --- the other families ----------------------------------------------------------------------

def _template(tokenizer: Tokenizer, template: dict[str, str]) -> processors.TemplateProcessing:
    return processors.TemplateProcessing(**template, special_tokens=[
        (token, tokenizer.token_to_id(token)) for token in ("[CLS]", "[SEP]")])


def _byte_level_bpe(corpus: Path, specials: list[str], vocab_size: int = 1000) -> Tokenizer:
    """Byte-level BPE (RoBERTa's and ModernBERT's kind): every byte is in the vocabulary, so nothing is unknown."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train([str(corpus)], trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tokenizer


def _save(tokenizer: Tokenizer, output: Path, tokenizer_class: str, **init: Any) -> None:
    """``init``: the special tokens, and what else the tokenizer's config holds (``model_input_names``)."""
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=512, **init)
    wrapped.save_pretrained(output)
    config_file = output / "tokenizer_config.json"
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"tokenizer_class": tokenizer_class},
                                      indent=2) + "\n")


def _wordpiece_family(corpus: Path, output: Path, tokenizer_class: str) -> None:
    _save(train_tokenizer(corpus).backend_tokenizer, output, tokenizer_class, unk_token="[UNK]", pad_token="[PAD]",
          cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


def _roberta_tokenizer(corpus: Path, output: Path) -> None:
    """RoBERTa's specials: ``<s> <pad> </s> <unk>`` first, ``<mask>`` the last id (50264 in roberta-base)."""
    tokenizer = _byte_level_bpe(corpus, ["<s>", "<pad>", "</s>", "<unk>"])
    tokenizer.add_special_tokens(["<mask>"])
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True,
                                                            add_prefix_space=False)
    _save(tokenizer, output, "RobertaTokenizer", bos_token="<s>", eos_token="</s>", sep_token="</s>",
          cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>")


def _modernbert_tokenizer(corpus: Path, output: Path) -> None:
    """ModernBERT's: byte-level BPE with every special token after the vocabulary (50280 to 50284)."""
    tokenizer = _byte_level_bpe(corpus, [])
    tokenizer.add_special_tokens(["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"])
    tokenizer.post_processor = _template(tokenizer, {"single": "[CLS]:0 $A:0 [SEP]:0",
                                                     "pair": "[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1"})
    _save(tokenizer, output, "PreTrainedTokenizerFast", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
          pad_token="[PAD]", mask_token="[MASK]",
          model_input_names=["input_ids", "attention_mask"])  # ModernBERT's tokenizer gives no token types


def _deberta_v3_tokenizer(corpus: Path, output: Path) -> None:
    """As microsoft/deberta-v3-base ships it: a SentencePiece Unigram ``spm.model`` (``▁`` marks a space) with
    ``[PAD] [CLS] [SEP] [UNK]`` as ids 0 to 3, no tokenizer.json, and ``[MASK]`` added after the vocabulary."""
    output.mkdir(parents=True, exist_ok=True)
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(output / "spm"), vocab_size=400, model_type="unigram",
        pad_id=0, bos_id=1, eos_id=2, unk_id=3, pad_piece="[PAD]", bos_piece="[CLS]", eos_piece="[SEP]",
        unk_piece="[UNK]", character_coverage=1.0, num_threads=1, minloglevel=2)
    (output / "spm.vocab").unlink()
    (output / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "DebertaV2Tokenizer", "do_lower_case": False, "vocab_type": "spm",
         "mask_token": "[MASK]", "model_max_length": 512}, indent=2) + "\n")


FAMILIES: dict[str, tuple[Callable[[Path, Path], None], Callable[[PreTrainedTokenizerBase], PretrainedConfig]]] = {
    "bert": (lambda corpus, output: train_tokenizer(corpus).save_pretrained(output),
             lambda t: BertConfig(vocab_size=len(t), max_position_embeddings=512, type_vocab_size=2,
                                  pad_token_id=t.pad_token_id, **LAYERS)),
    "distilbert": (functools.partial(_wordpiece_family, tokenizer_class="DistilBertTokenizer"),
                   lambda t: DistilBertConfig(vocab_size=len(t), dim=128, n_layers=2, n_heads=2, hidden_dim=512,
                                              max_position_embeddings=512, pad_token_id=t.pad_token_id)),
    "electra": (functools.partial(_wordpiece_family, tokenizer_class="BertTokenizer"),
                lambda t: ElectraConfig(vocab_size=len(t), embedding_size=64, max_position_embeddings=512,
                                        pad_token_id=t.pad_token_id, **LAYERS)),
    "roberta": (_roberta_tokenizer,
                lambda t: RobertaConfig(vocab_size=len(t), max_position_embeddings=514, type_vocab_size=1,
                                        pad_token_id=t.pad_token_id, bos_token_id=t.cls_token_id,
                                        eos_token_id=t.sep_token_id, **LAYERS)),
    "deberta-v3": (_deberta_v3_tokenizer,
                   lambda t: DebertaV2Config(vocab_size=len(t), max_position_embeddings=512, type_vocab_size=0,
                                             relative_attention=True, position_buckets=64, norm_rel_ebd="layer_norm",
                                             pos_att_type=["p2c", "c2p"], share_att_key=True,
                                             position_biased_input=False, max_relative_positions=-1,
                                             pad_token_id=t.pad_token_id, **LAYERS)),
    "modernbert": (_modernbert_tokenizer,
                   lambda t: ModernBertConfig(vocab_size=len(t), hidden_size=128, intermediate_size=256,
                                              num_hidden_layers=3, num_attention_heads=2, max_position_embeddings=512,
                                              local_attention=64, pad_token_id=t.pad_token_id,
                                              bos_token_id=t.cls_token_id, cls_token_id=t.cls_token_id,
                                              eos_token_id=t.sep_token_id, sep_token_id=t.sep_token_id)),
}
"""Family name -> (write its tokenizer files, its tiny config for the loaded tokenizer)."""


def build_family_dir(family: str, corpus: Path, output: Path) -> Path:
    """A tiny model directory of ``family``: the tokenizer files, loaded back through ``AutoTokenizer`` (the
    family's own tokenizer class, as from the hub), and a config sized to that tokenizer. No weights."""
    write_tokenizer, config_of = FAMILIES[family]
    output.mkdir(parents=True, exist_ok=True)
    write_tokenizer(corpus, output)
    config_of(AutoTokenizer.from_pretrained(output)).save_pretrained(output)
    return output


def main(argv: list[str] | None = None) -> None:
    """``python -m distqa.encoders.tiny --corpus data/tokenizer-corpus.txt --output data/tiny-bert``;
    ``python -m distqa.encoders.tiny --family roberta --output /tmp/tiny-roberta``"""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=list(FAMILIES), default="bert")
    parser.add_argument("--corpus", type=Path, default=Path("data/tokenizer-corpus.txt"))
    parser.add_argument("--output", type=Path, help="default: data/tiny-bert for bert, data/tiny-FAMILY otherwise")
    args = parser.parse_args(argv)
    if not args.corpus.is_file():
        parser.error(f"--corpus {args.corpus} does not exist; run from the repository root.")
    output = args.output or Path(f"data/tiny-{args.family}")
    print(f"wrote {build_family_dir(args.family, args.corpus, output)}")


if __name__ == "__main__":
    main()
