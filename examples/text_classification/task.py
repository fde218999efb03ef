"""A fork's own task, whole: a text classifier with its own settings, data, model, loss and metric.

Nothing under src/distqa/ knows it. Every launcher runs it with one flag (docs/FORKING.md)::

    python -m distqa.train --preset examples/text_classification/preset.toml
    scripts/run_distributed_locally.sh -- --preset examples/text_classification/preset.toml
    scripts/run_distributed_locally.sh -- --task examples.text_classification.task:TextClassification

and it gets what every task gets: DDP with the same global batch on any number of processes, exact
resume after a kill or a SIGTERM, the preflight and the doctor, best.pt kept by its own metric (accuracy).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from distqa.tasks import (
    Batch,
    BestMetric,
    Config,
    ConfigError,
    DataError,
    Evaluation,
    Precision,
    Runtime,
    Section,
    Task,
    all_gather_tensor,
    on_device,
    resolve_path,
)

# --- settings: one section, shown by `python -m distqa.train --task ... --help` ------------------------

TEXT = Section("text_classification", "text classification (examples/text_classification)")
PAD, UNKNOWN = 0, 1
"""Word ids every vocabulary starts with."""


@dataclass
class TextClassificationConfig(Config):
    data_file: str = TEXT(
        "examples/text_classification/reviews.tsv", "Labelled texts, one per line: LABEL<TAB>TEXT.",
        defines_run=True, must_exist="write it with `python -m examples.text_classification.make_data`")
    validation_fraction: float = TEXT(0.2, "Share of the lines held out for validation (0 < f < 1).",
                                      defines_run=True)
    max_words: int = TEXT(32, "Words per text; longer texts are cut.", defines_run=True)
    embedding_dim: int = TEXT(32, "Size of a word's vector.", defines_run=True)
    classifier_dropout: float = TEXT(0.1, "Dropout on the text's vector before the classifier (0 <= p < 1).")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.validation_fraction < 1:
            raise ConfigError(f"validation_fraction must be in (0, 1), got {self.validation_fraction}.")
        if self.max_words < 1 or self.embedding_dim < 1:
            raise ConfigError("max_words and embedding_dim must be positive integers.")
        if not 0 <= self.classifier_dropout < 1:
            raise ConfigError(f"classifier_dropout must be in [0, 1), got {self.classifier_dropout}.")


# --- data: the file, split once; words become ids ------------------------------------------------------

@dataclass(frozen=True)
class Corpus:
    """The labelled lines of the data file, split into training and validation, with the vocabulary and
    the label names drawn from the training lines (sorted, so every rank draws the same)."""

    train: list[tuple[str, str]]
    validation: list[tuple[str, str]]
    vocabulary: dict[str, int]
    labels: list[str]

    @classmethod
    def read(cls, path: Path, validation_fraction: float) -> Corpus:
        rows = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            label, tab, text = line.partition("\t")
            if not tab or not label.strip() or not text.strip():
                raise DataError(f"{path}:{number}: expected LABEL<TAB>TEXT, got {line[:60]!r}; fix or remove the line.")
            rows.append((label.strip(), text))
        held_out = set(np.random.default_rng(0).permutation(len(rows))[:round(len(rows) * validation_fraction)])
        train = [row for i, row in enumerate(rows) if i not in held_out]
        validation = [row for i, row in enumerate(rows) if i in held_out]
        if not train or not validation:
            raise DataError(f"{path}: {len(rows)} lines give an empty training or validation split; add lines.")
        words = sorted({word for _, text in train for word in text.lower().split()})
        labels = sorted({label for label, _ in train})
        unseen = sorted({label for label, _ in validation} - set(labels))
        if unseen:
            raise DataError(f"{path}: labels {unseen} occur only in validation lines; add training lines for them.")
        return cls(train, validation, {word: i for i, word in enumerate(words, start=2)}, labels)


class LabelledTexts(Dataset):
    """Texts as ``max_words`` word ids (padded), with an attention mask and the label's index."""

    def __init__(self, rows: list[tuple[str, str]], corpus: Corpus, max_words: int) -> None:
        self.rows, self.corpus, self.max_words = rows, corpus, max_words

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        label, text = self.rows[index]
        ids = [self.corpus.vocabulary.get(word, UNKNOWN) for word in text.lower().split()][:self.max_words]
        input_ids = torch.full((self.max_words,), PAD)
        input_ids[:len(ids)] = torch.tensor(ids)
        return {"input_ids": input_ids, "attention_mask": (input_ids != PAD).long(),
                "label": torch.tensor(self.corpus.labels.index(label))}


# --- model and metric ----------------------------------------------------------------------------------

class BagOfWords(nn.Module):
    """The mean of the words' vectors, then a linear classifier: logits over the labels."""

    def __init__(self, vocabulary_size: int, embedding_dim: int, num_labels: int, dropout: float) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocabulary_size, embedding_dim, padding_idx=PAD)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(embedding_dim, num_labels)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask.unsqueeze(-1).float()
        mean = (self.embedding(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1)
        return self.classifier(self.dropout(mean))


class Accuracy:
    """The share of validation texts whose label the model gets right; each rank scores every
    ``world_size``-th text and the ranks add up their counts."""

    best_metric = BestMetric("accuracy", "max")

    def __init__(self, dataset: LabelledTexts, runtime: Runtime, batch_size: int, corpus: Corpus) -> None:
        shard = Subset(dataset, range(runtime.rank, len(dataset), runtime.world_size))
        self.loader = DataLoader(shard, batch_size=batch_size)
        self.runtime, self.corpus = runtime, corpus

    @torch.no_grad()
    def evaluate(self, model: nn.Module, precision: Precision) -> Evaluation:
        was_training = model.training
        model.eval()
        counts = torch.zeros(3, dtype=torch.float64, device=self.runtime.device)  # right, texts, summed loss
        try:
            for batch in self.loader:
                batch = on_device(batch, self.runtime.device)
                with precision.autocast():
                    logits = model(batch["input_ids"], batch["attention_mask"]).float()
                counts += torch.stack([(logits.argmax(-1) == batch["label"]).sum().double(),
                                       torch.tensor(len(logits), dtype=torch.float64, device=counts.device),
                                       F.cross_entropy(logits, batch["label"], reduction="sum").double()])
        finally:
            model.train(was_training)
        right, texts, loss = all_gather_tensor(counts).sum(0).tolist()
        # What inference needs besides the weights: how words and labels map to ids.
        state = {"labels": self.corpus.labels, "vocabulary": self.corpus.vocabulary}
        return Evaluation(metrics={"accuracy": right / texts, "loss": loss / texts, "texts": texts}, state=state,
                          summary=f"accuracy {right / texts:.4f}, loss {loss / texts:.4f} on {texts:.0f} texts")


# --- the task: what the trainer calls ------------------------------------------------------------------

class TextClassification(Task):
    name = "text_classification"
    config_class = TextClassificationConfig
    input_names = ("input_ids", "attention_mask")
    config: TextClassificationConfig

    @functools.cached_property
    def corpus(self) -> Corpus:
        return Corpus.read(resolve_path(self.config.data_file), self.config.validation_fraction)

    def check_inputs(self, may_build: bool) -> None:
        self.corpus  # noqa: B018 -- reading the file is the check: a bad line fails before any process group

    def train_dataset(self) -> Dataset:
        return LabelledTexts(self.corpus.train, self.corpus, self.config.max_words)

    def build_model(self) -> nn.Module:
        return BagOfWords(len(self.corpus.vocabulary) + 2, self.config.embedding_dim, len(self.corpus.labels),
                          self.config.classifier_dropout)

    def loss(self, output: torch.Tensor, batch: Batch) -> torch.Tensor:
        return F.cross_entropy(output.float(), batch["label"])

    def evaluator(self, runtime: Runtime) -> Accuracy:
        validation = LabelledTexts(self.corpus.validation, self.corpus, self.config.max_words)
        return Accuracy(validation, runtime, self.config.eval_batch_size, self.corpus)
