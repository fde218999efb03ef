"""distqa: multi-node DistributedDataParallel training of a BERT-family question-answering model."""

__version__ = "0.1.0"
