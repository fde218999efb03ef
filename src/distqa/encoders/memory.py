"""The peak memory of one training step on one rank of a model around a transformers encoder, estimated from
the encoder's architecture: :class:`EncoderMemory`, what an encoder task's ``training_memory`` returns for the
doctor (:mod:`distqa.tasks.step_memory`). What it counts, part by part, sharded or not, and its measured error:
docs/FAULT_TOLERANCE.md, "The memory check"; here, what that page leaves out.

Nothing is allocated: the parameters are counted on a model built on the meta device (:func:`count_on_meta`). The
fp32 weights are the master copy, mixed precision only casts them. Under DDP (``gradient_as_bucket_view``) the
gradients are views of the all-reduce buckets, allocated once and kept for the whole step (so they are with gradient
accumulation); a single process without accumulation allocates them in the backward, as the activations go
(``zero_grad(set_to_none=True)`` frees them after every step). Autocast casts each ``nn.Linear`` weight once per
forward (its cache of leaf casts) and the matmul keeps the copy for its backward. The activations are counted tensor
by tensor for a BERT-style layer (:func:`layer_activations`; DeBERTa's disentangled attention adds its own terms),
times the layers, plus the embeddings and the QA heads; the transients are :func:`forward_transient` (the residual
stream's fp32 tensors still referenced at the end of a layer's forward) and :func:`backward_transient` (the
gradients of the layer being differentiated). The peak is the largest of the step's moments: the end of the forward
(autocast's cache still holding every weight and bias copy), the start of the backward, with checkpointing the
backward of a recomputed layer (with its weight copies), and the end of the backward (every gradient, plus the
embedding's gradient as a dense tensor before DDP copies it into its bucket). Sharded
(:class:`distqa.tasks.step_memory.ShardingUnits`), the activations are counted as under autocast, an upper bound:
without it the residual stream, the LayerNorms and CUDA's softmax stay in bf16 instead of fp32.

What the kernels keep is taken from their source: on CUDA a dropout keeps a 1-byte mask (``native_dropout``), on
CPU a noise tensor of its input's dtype (``at::dropout``); CUDA's autocast runs softmax in fp32 (its fp32 list),
CPU's does not; SDPA runs a fused kernel on CUDA (flash, memory-efficient or cuDNN: no seq × seq matrix, a
log-sum-exp per row) and on CPU only without dropout, else its math path, which upcasts bf16 to fp32 and keeps the
seq × seq probabilities like eager attention. ``tests/qa/test_memory.py`` holds the estimate to the peak measured on
CPU (the profiler's allocator events) for tiny models and several shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PretrainedConfig

from distqa.tasks.base import default_sharding_units
from distqa.tasks.step_memory import ShardingUnits, Step, StepMemory


@dataclass(frozen=True)
class Encoder:
    """A transformer encoder's sizes, as its activations depend on them (read from its transformers config)."""

    model_type: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    vocab: int
    hidden_dropout: float
    attention_dropout: float
    relative_span: int = 0
    """DeBERTa: rows of relative-position embeddings each layer attends over (2 × position buckets); 0: none."""
    position_terms: int = 0
    """DeBERTa: how many of its position-to-content and content-to-position terms the attention adds (0..2)."""

    COUNTED_TYPES = ("bert", "roberta", "xlm-roberta", "electra", "deberta-v2")
    """Model types whose layers the activations follow op by op: BERT's layer (RoBERTa's and ELECTRA's are
    copies of it in transformers) and DeBERTa-v2's; tests/qa/test_memory.py measures BERT and DeBERTa-v3. Another
    type (ModernBERT's gated feed-forward, DistilBERT) is counted as BERT layers of its sizes, an approximation."""

    @property
    def counted(self) -> bool:
        return self.model_type in self.COUNTED_TYPES

    @classmethod
    def of(cls, config: PretrainedConfig) -> Encoder:
        """The sizes of ``config`` (BERT, RoBERTa, ELECTRA, DistilBERT, DeBERTa-v2/v3 name them differently)."""
        def first(*names: str) -> float:
            for name in names:
                if getattr(config, name, None) is not None:
                    return getattr(config, name)
            raise ValueError(f"model config ({type(config).__name__}) has none of {', '.join(names)}: cannot "
                             "estimate its activations; distqa.tasks.step_memory knows BERT-style encoder configs")

        span, terms = 0, 0
        if getattr(config, "relative_attention", False):  # DeBERTa-v2/v3 (modeling_deberta_v2.py)
            buckets = getattr(config, "position_buckets", -1)
            relative = getattr(config, "max_relative_positions", -1)
            span = 2 * (buckets if buckets > 0 else relative if relative > 0 else config.max_position_embeddings)
            terms = len({"c2p", "p2c"} & set(getattr(config, "pos_att_type", None) or ()))
        return cls(model_type=config.model_type, layers=int(first("num_hidden_layers", "n_layers")),
                   hidden=int(first("hidden_size", "dim")), intermediate=int(first("intermediate_size", "hidden_dim")),
                   heads=int(first("num_attention_heads", "n_heads")), vocab=int(config.vocab_size),
                   hidden_dropout=float(first("hidden_dropout_prob", "dropout", "mlp_dropout")),
                   attention_dropout=float(first("attention_probs_dropout_prob", "attention_dropout")),
                   relative_span=span, position_terms=terms)


@dataclass(frozen=True)
class EncoderMemory:
    """One rank's memory in a training step of a model around a transformers encoder, as a function of the step's
    settings: the model's counted parameters, its encoder's sizes and the longest batch it runs on (a
    :class:`distqa.tasks.step_memory.TrainingMemory`). :meth:`estimate` gives the figure for one
    :class:`~distqa.tasks.step_memory.Step`;
    :func:`distqa.tasks.step_memory.fixes` what to change when it does not fit."""

    parameters: int
    """Trainable parameters, counted."""
    linear_weights: int
    """Elements of every ``nn.Linear`` weight (autocast keeps a low-precision copy of each for the backward)."""
    linear_biases: int
    encoder: Encoder
    seq_len: int
    """Tokens per example in the longest batch (batches cut to their longest window are at most this long)."""
    attention: str = "sdpa"
    """The encoder's attention kernel: 'sdpa' or 'eager' (DeBERTa-v2 has eager only)."""
    largest_layer: int = 0
    """Trainable parameters of the largest encoder layer: the largest sharding unit."""
    outside_layers: int = 0
    """Trainable parameters outside the encoder layers (embeddings, heads): the root unit when sharded."""

    @classmethod
    def of_model(cls, model: nn.Module, encoder_config: PretrainedConfig, seq_len: int,
                 attention: str = "sdpa") -> EncoderMemory:
        """Counted on ``model`` (build it with :func:`count_on_meta`: no memory), sized by ``encoder_config``."""
        linears = [module for module in model.modules() if isinstance(module, nn.Linear)]
        parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
        layers = [sum(p.numel() for p in unit.parameters() if p.requires_grad)
                  for unit in default_sharding_units(model)]  # the encoder's layers
        return cls(parameters=parameters, linear_weights=sum(m.weight.numel() for m in linears),
                   linear_biases=sum(m.bias.numel() for m in linears if m.bias is not None),
                   encoder=Encoder.of(encoder_config), seq_len=seq_len, attention=attention,
                   largest_layer=max(layers, default=0), outside_layers=parameters - sum(layers))

    def estimate(self, step: Step) -> StepMemory:
        """The peak of one training step with the settings of ``step`` (see the module docstring)."""
        encoder, batch, seq = self.encoder, step.micro_batch, self.seq_len
        kernels = Kernels.of(step, encoder, self.attention)
        if step.sharded:
            units = ShardingUnits(parameters=self.parameters, largest=self.largest_layer, root=self.outside_layers)
            forward_state, backward_state, end = (units.state(step, when) for when in ("forward", "backward", "end"))
        else:
            forward_state = backward_state = {"weights": 4 * self.parameters, "AdamW moments": 8 * self.parameters,
                                              "gradients": 4 * self.parameters if step.gradients_persist else 0}
            # At the end of the backward every gradient exists; under DDP the embedding's arrives as a dense
            # tensor that is then copied into its bucket.
            end = {"weights": 4 * self.parameters, "AdamW moments": 8 * self.parameters,
                   "gradients": 4 * self.parameters,
                   "transient": 4 * encoder.vocab * encoder.hidden if step.gradients_persist else 0}
        # Sharded, the weights are gathered in the compute dtype and the forward runs without autocast: the
        # gathered weights (ShardingUnits) are what the matmuls keep, and nothing is cast besides them.
        low = kernels.compute < 4 and not step.sharded
        copies = 2 * self.linear_weights if low else 0
        cached = 2 * (self.linear_weights + self.linear_biases) if low else 0  # autocast's cache during the forward
        layer = layer_activations(encoder, batch, seq, kernels)
        outside = outside_layers(encoder, batch, seq, kernels)
        forward, backward = forward_transient(encoder, batch, seq, kernels), backward_transient(encoder, batch, seq,
                                                                                               kernels)
        if step.activation_checkpointing:
            kept = encoder.layers * 4 * encoder.hidden * batch * seq + outside  # each layer's fp32 input
            moments = {
                "forward end": {**forward_state, "weight copies": cached, "activations": kept, "transient": forward},
                "backward": {**backward_state, "weight copies": copies // encoder.layers,  # one layer's
                             "activations": kept + layer, "transient": max(forward, backward)},
                "backward end": end}
        else:
            activations = encoder.layers * layer + outside
            moments = {
                "forward end": {**forward_state, "weight copies": cached, "activations": activations,
                                "transient": forward},
                "backward start": {**backward_state, "weight copies": copies, "activations": activations,
                                   "transient": backward},
                "backward end": end}
        moment = max(moments, key=lambda name: sum(moments[name].values()))
        return StepMemory(parts=moments[moment], moment=moment)

    def describe(self, step: Step) -> str:
        """What the estimate of ``step`` assumed, for the doctor's line."""
        approximated = "" if self.encoder.counted else f"; {self.encoder.model_type} counted as BERT layers"
        return (f"micro-batch {step.micro_batch} × {self.seq_len} tokens, {step.precision}, {self.attention} "
                f"attention, activation checkpointing {'on' if step.activation_checkpointing else 'off'}, on "
                f"{'CUDA' if step.device_type == 'cuda' else 'CPU'} (distqa.encoders.memory{approximated})")


@dataclass(frozen=True)
class Kernels:
    """Bytes per element of what the step's kernels keep, for a device and a precision (module docstring)."""

    compute: int
    """Bytes of a matmul's inputs and outputs: 2 under bf16/fp16 autocast, 4 in fp32."""
    cuda: bool
    fused_attention: bool
    """SDPA's fused kernel (no seq × seq matrix), or the seq × seq probabilities of eager/math attention."""
    attention_compute: int
    """Bytes of q, k, v and the probabilities in the attention: CPU's math path upcasts bf16 to fp32."""

    @classmethod
    def of(cls, step: Step, encoder: Encoder, attention: str) -> Kernels:
        compute = 4 if step.precision == "fp32" else 2
        cuda = step.device_type == "cuda"
        sdpa = attention == "sdpa" and not encoder.relative_span  # DeBERTa-v2 has eager attention only
        fused = sdpa and (cuda or encoder.attention_dropout == 0)
        math_path = sdpa and not fused  # CPU: scaled_dot_product_attention's math kernel computes in fp32
        return cls(compute=compute, cuda=cuda, fused_attention=fused, attention_compute=4 if math_path else compute)

    def mask(self, element_bytes: int, probability: float) -> int:
        """Bytes per element a dropout keeps for its backward: none at p = 0, a bool mask on CUDA, a noise
        tensor of its input's dtype on CPU."""
        return 0 if probability == 0 else 1 if self.cuda else element_bytes

    def softmax(self, input_bytes: int) -> int:
        """Bytes per element of a softmax's output: fp32 under CUDA's autocast, the input's dtype otherwise."""
        return 4 if self.cuda and self.compute < 4 else input_bytes


def layer_activations(encoder: Encoder, batch: int, seq: int, kernels: Kernels) -> int:
    """Bytes one encoder layer keeps for its backward (BERT's layer; DeBERTa's attention adds its terms).

    Per token: the inputs of the linears (in fp32 the layer's input and the first LayerNorm's output, each kept
    once; under autocast a cast copy per linear: q, k, v and the intermediate), the attention's q, k, v and
    output, two dropout masks, two LayerNorm inputs (fp32: the residual stream) with their mean and inverse
    deviation, and the GELU's input and output (intermediate size). Per sequence × heads: the seq × seq
    probabilities of eager or math attention (the softmax's output, the dropout's mask, the dropout's output as
    the next matmul's input) or the fused kernel's log-sum-exp; per sequence: the padding mask as the kernel
    takes it."""
    b, s, h, heads = batch, seq, encoder.hidden, encoder.heads
    tokens, c, a = b * s, kernels.compute, kernels.attention_compute
    linear_inputs = 8 * h if c == 4 else 4 * c * h
    residual = 2 * (4 * h + 8) + 2 * kernels.mask(c, encoder.hidden_dropout) * h
    feed_forward = 2 * c * encoder.intermediate
    per_token = linear_inputs + residual + feed_forward
    if kernels.fused_attention:
        per_token += 3 * c * h + c * h + 4 * heads  # q, k, v; the output (also the next linear's input); lse
        per_sequence_square = c  # the padding mask as an additive bias, per layer
        scores = 0
    else:
        relative = encoder.relative_span > 0
        copies = 3 + (1 if relative and encoder.position_terms == 2 else 0)  # q, k (DeBERTa: scaled, and as is), v
        per_token += copies * a * h + c * h  # the copies the batched matmuls take, and the output for the linear
        # BERT adds an fp32 padding mask to the scores (promoting them); DeBERTa fills them in their own dtype.
        softmax = kernels.softmax(a if relative else 4)
        dropped = encoder.attention_dropout > 0
        scores = softmax + kernels.mask(softmax, encoder.attention_dropout) + (a if dropped or softmax != a else 0)
        per_sequence_square = 1 if relative else 0  # DeBERTa: the inverted bool mask masked_fill keeps
    total = tokens * per_token + b * heads * s * s * scores + b * s * s * per_sequence_square
    if encoder.relative_span:
        span, terms = encoder.relative_span, encoder.position_terms
        total += terms * (tokens * heads * span * c  # c2p / p2c scores before the gather, kept by it
                          + b * span * h * c  # the position keys / queries repeated for every sequence
                          + s * s * 8)  # the gather's index (int64, shared by the batch)
        total += span * h * (kernels.mask(4, encoder.hidden_dropout) + terms * c)  # relative embeddings: dropout, casts
    return total


def outside_layers(encoder: Encoder, batch: int, seq: int, kernels: Kernels) -> int:
    """Bytes kept outside the layers: the batch (three int64 columns), the embeddings' LayerNorm input and
    dropout mask, the span head's input and the loss's log-softmax outputs (about 10 bytes per token); eager
    BERT's fp32 padding mask, built once for every layer."""
    tokens, h = batch * seq, encoder.hidden
    embeddings = 24 + 4 * h + 8 + kernels.mask(4, encoder.hidden_dropout) * h
    heads = kernels.compute * h + 10
    mask = 4 * batch * seq ** 2 if not kernels.fused_attention and not encoder.relative_span else 0
    return tokens * (embeddings + heads) + mask


def forward_transient(encoder: Encoder, batch: int, seq: int, kernels: Kernels) -> int:
    """Bytes a layer's forward holds beyond what it keeps, at its end: five fp32 tensors of the residual stream
    (the layer's input, the first LayerNorm's output still needed as the residual, the second's being written
    and the sums before them; counted on CPU) and a low-precision one; eager BERT attention also returns its
    probabilities (the fp32 dropout output, when the matmul kept a cast copy instead) until the layer returns.
    DeBERTa's attention holds three seq × seq tensors at once while it sums its content and position terms."""
    tokens, h, scores = batch * seq, encoder.hidden, batch * encoder.heads * seq ** 2
    total = tokens * (5 * 4 * h + kernels.compute * h)
    if encoder.relative_span:  # the content-content scores, the position terms and their sum: three at once
        return max(total, 3 * scores * kernels.compute)
    if not kernels.fused_attention:
        softmax = kernels.softmax(4)
        if softmax != kernels.attention_compute:
            total += scores * softmax
    return total


def backward_transient(encoder: Encoder, batch: int, seq: int, kernels: Kernels) -> int:
    """Bytes the backward of a layer holds beyond what is kept: the largest of the residual stream's two fp32
    gradients, the feed-forward's gradient at the intermediate size with the residual's, and (eager or math
    attention) the gradient of the probabilities (each step of their backward frees a kept tensor as it makes
    a gradient of the same size: one at a time)."""
    tokens, h, c = batch * seq, encoder.hidden, kernels.compute
    candidates = [tokens * 2 * 4 * h, tokens * (c * encoder.intermediate + 4 * h)]
    if not kernels.fused_attention:
        candidates.append(batch * encoder.heads * seq ** 2
                          * kernels.softmax(kernels.attention_compute))
    return max(candidates)


def count_on_meta(build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` on the meta device: every parameter has its shape and no memory (nothing is loaded)."""
    with torch.device("meta"):
        return build()
