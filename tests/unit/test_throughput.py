"""The FLOPs formula against a hand count for BERT-base, the GPU peak table, MFU."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertModel, ModernBertConfig

from distqa.encoders.flops import encoder_on_meta, model_flops_per_token, non_embedding_parameters
from distqa.record.throughput import mfu, peak_bf16_flops

BERT_BASE = BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                       intermediate_size=3072, max_position_embeddings=512)


def test_bert_base_flops_per_token_match_a_hand_count():
    # One BERT-base layer, by hand (h = 768, I = 3072):
    q_k_v_output = 4 * (768 * 768 + 768)                 # 2,362,368
    feed_forward = 768 * 3072 + 3072 + 3072 * 768 + 768  # 4,722,432
    layer_norms = 2 * (768 + 768)                        # 3,072
    per_layer = q_k_v_output + feed_forward + layer_norms
    assert per_layer == 7_087_872
    embeddings_layer_norm = 768 + 768                    # counted like every LayerNorm; the tables are not
    non_embedding = 12 * per_layer + embeddings_layer_norm
    assert non_embedding_parameters(encoder_on_meta(BERT_BASE)) == non_embedding == 85_056_000
    # Attention scores and their weighted sum: 2 matmuls × 2·h·s FLOPs forward per token per layer, ×3 with backward.
    seq = 384
    attention = 3 * 2 * (2 * 768 * seq) * 12
    assert model_flops_per_token(BERT_BASE, seq) == 6 * non_embedding + attention == 552_803_328
    # seq 512: only the attention term grows, by 12 · L · h per token of sequence
    assert model_flops_per_token(BERT_BASE, 512) - model_flops_per_token(BERT_BASE, 384) == 12 * 12 * 768 * 128


def test_non_embedding_parameters_leave_out_the_embedding_tables_and_the_pooler():
    # An independent count: transformers' own BERT-base (on the meta device: no memory, no time).
    with torch.device("meta"):
        encoder = BertModel(BERT_BASE, add_pooling_layer=True)
    tables = sum(p.numel() for name, p in encoder.named_parameters() if name.endswith("embeddings.weight"))
    pooler = sum(p.numel() for p in encoder.pooler.parameters())
    assert non_embedding_parameters(encoder) == sum(p.numel() for p in encoder.parameters()) - tables - pooler
    assert tables == (30522 + 512 + 2) * 768 and sum(p.numel() for p in encoder.parameters()) == 109_482_240
    # the model given or its config: the same count (the config's on a meta-device instance)
    assert model_flops_per_token(encoder, 128) == model_flops_per_token(BERT_BASE, 128)


def test_modernbert_base_counts_its_gated_feed_forward():
    """The issue's case: BERT's formula on ModernBERT-base's sizes gave 91.0 M layer parameters; its modules
    hold 110.3 M (a gated feed-forward of 2 × 1152 inputs, no biases): everything but its 50368 × 768 table."""
    config = ModernBertConfig()  # ModernBERT-base
    encoder = encoder_on_meta(config)
    assert non_embedding_parameters(encoder) == 149_014_272 - 50368 * 768 == 110_331_648
    with pytest.raises(ValueError, match="seq_len"):
        model_flops_per_token(config, 0)


@pytest.mark.parametrize(("device_name", "tflops"), [
    ("NVIDIA H100 80GB HBM3", 989),   # the SXM part, as CUDA names it
    ("NVIDIA H100 PCIe", 756),
    ("NVIDIA H100 NVL", 835),
    ("NVIDIA H200", 989),
    ("NVIDIA A100-SXM4-80GB", 312),
    ("NVIDIA A100 80GB PCIe", 312),
    ("NVIDIA L4", 121),
    ("NVIDIA A10G", 125),
    ("Tesla V100-SXM2-16GB", 125),
])
def test_peak_bf16_flops_by_device_name(device_name, tflops):
    assert peak_bf16_flops(device_name) == tflops * 1e12


@pytest.mark.parametrize("device_name", ["NVIDIA L40S", "NVIDIA GeForce RTX 4090", "cpu", "", "NVIDIA GH100X"])
def test_unknown_devices_have_no_peak(device_name):
    assert peak_bf16_flops(device_name) is None


def test_mfu_is_achieved_over_peak_flops():
    flops_per_token = model_flops_per_token(BERT_BASE, 512)
    tokens_per_s = 0.4 * 989e12 / flops_per_token
    assert mfu(tokens_per_s, flops_per_token, 989e12) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="peak_flops"):
        mfu(1.0, 1.0, 0.0)
