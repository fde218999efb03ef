"""Build the offline tiny model directory: a WordPiece tokenizer trained on bundled text + a small BERT config.

Every default path of this recipe runs without network access, so the default "model" is a directory
that ``transformers`` loads like any hub model, but whose tokenizer was trained here with the
``tokenizers`` library on ``data/tokenizer-corpus.txt`` and whose encoder is initialised randomly
(``from_scratch = true``). The result is committed under ``data/tiny-bert`` and is the reference: the
trainer breaks merge ties in no fixed order, so a rebuild gives an equivalent but not byte-identical
vocabulary. Rebuild it with::

    python -m distqa.tiny --corpus data/tokenizer-corpus.txt --output data/tiny-bert
"""

from __future__ import annotations

import argparse
import string
from pathlib import Path

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece
from tokenizers.trainers import WordPieceTrainer
from transformers import BertConfig, PreTrainedTokenizerFast

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def train_tokenizer(corpus: Path, vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """A lower-casing BERT WordPiece tokenizer; printable ASCII is always in the vocabulary, so
    unseen English words split into pieces instead of becoming [UNK]."""
    tokenizer = Tokenizer(WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, min_frequency=1,
        initial_alphabet=sorted(set(string.printable.lower()) - set(string.whitespace)),
    )
    tokenizer.train([str(corpus)], trainer)
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]", model_max_length=512,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def tiny_bert_config(vocab_size: int, pad_token_id: int) -> BertConfig:
    """Two layers of width 128: fast on a laptop CPU, same code path as bert-base."""
    return BertConfig(
        vocab_size=vocab_size, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=512, max_position_embeddings=512, type_vocab_size=2,
        pad_token_id=pad_token_id,
    )


def build_tiny_model_dir(corpus: Path, output: Path) -> Path:
    tokenizer = train_tokenizer(corpus)
    output.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(output)
    tiny_bert_config(len(tokenizer), tokenizer.pad_token_id).save_pretrained(output)
    return output


def main(argv: list[str] | None = None) -> None:
    """``python -m distqa.tiny --corpus data/tokenizer-corpus.txt --output data/tiny-bert``"""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=Path("data/tokenizer-corpus.txt"))
    parser.add_argument("--output", type=Path, default=Path("data/tiny-bert"))
    args = parser.parse_args(argv)
    if not args.corpus.is_file():
        parser.error(f"--corpus {args.corpus} does not exist; run from the repository root.")
    print(f"wrote {build_tiny_model_dir(args.corpus, args.output)}")


if __name__ == "__main__":
    main()
