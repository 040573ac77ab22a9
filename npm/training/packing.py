"""Padding-free encoding for training (``training.packed``; docs/paper-scale.md §7): the rows of a batch are
concatenated into one row without pads, each token attends only to its own row, and each row's positions restart as
in its padded row, so the GPU does no work on pad tokens; the hidden states are scattered back to the padded
[rows, length, dim] layout (zeros at pads), so the losses (``npm.training.loss``) are unchanged.

Attention runs on torch's own variable-length kernels: the packed queries, keys and values are viewed as a jagged
nested tensor (``torch.nested.nested_tensor_from_jagged`` with the rows' cumulative lengths) and go through
``scaled_dot_product_attention``, which on CUDA dispatches to the flash / memory-efficient varlen kernels (attention
dropout included) and on the CPU computes each row by itself. It is a transformers attention function
(``AttentionInterface``, name ``PACKED``) that reads the rows' bounds from the ``cu_seq_lens_q`` / ``max_length_q``
keywords the encoder forwards to every attention layer.

Positions: BERT counts from 0 in every row; RoBERTa from ``padding_idx + 1`` (its embeddings derive positions from the
ids, counting non-pad tokens); ``first_position`` gives the offset, and the packed call passes the positions
explicitly. Equal to the padded encoding up to fp32 rounding (tests/test_packed.py); with dropout the random draws
differ (other shapes), which is why the run id records ``packed``.
"""

from __future__ import annotations

import torch

PACKED = "npm_packed"  # the attention implementation's name in transformers' AttentionInterface


@torch.compiler.disable  # a nested tensor inside a compiled graph fails its backward (torch 2.11, CUDA): eager here
def packed_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                     cu_seq_lens_q: torch.Tensor | None = None, max_length_q: int | None = None, **kwargs):
    """transformers attention function (``sdpa_attention_forward``'s signature) over one packed row: ``query`` /
    ``key`` / ``value`` [1, heads, tokens, dim]; rows bounded by ``cu_seq_lens_q`` [rows + 1]. Returns
    ([1, tokens, heads, dim], None). Not compiled: a compiled encoder runs the rest of each layer compiled."""
    if cu_seq_lens_q is None or attention_mask is not None or query.shape[0] != 1:
        raise ValueError("packed attention needs one packed row, its bounds (cu_seq_lens_q) and no attention mask; "
                         "encode with npm.training.packing.encode_packed")

    def jagged(x: torch.Tensor) -> torch.Tensor:  # [1, H, T, D] -> [rows, H, jagged T, D]
        flat = x[0].transpose(0, 1)  # [T, H, D]
        return torch.nested.nested_tensor_from_jagged(flat, cu_seq_lens_q, max_seqlen=max_length_q).transpose(1, 2)

    out = torch.nn.functional.scaled_dot_product_attention(jagged(query), jagged(key), jagged(value),
                                                           dropout_p=dropout, scale=scaling)
    return out.transpose(1, 2).values().unsqueeze(0), None  # [1, T, H, D]


def use_packed_attention(model) -> None:
    """Make ``model`` (a transformers encoder) attend with ``packed_attention``: registered once under ``PACKED``,
    then set as its attention implementation (a runtime choice, not saved by ``save_pretrained``)."""
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED, packed_attention)
    model.set_attn_implementation(PACKED)


def is_packed(model) -> bool:
    """Whether ``model`` (or the module a DistributedDataParallel wrapper holds) attends with ``packed_attention``."""
    return getattr(getattr(model, "module", model).config, "_attn_implementation", None) == PACKED


def first_position(model) -> int:
    """The position id of a row's first token: ``padding_idx + 1`` for RoBERTa-style embeddings (positions derived
    from the ids, ``create_position_ids_from_input_ids``), else 0 (BERT: ``arange``)."""
    embeddings = getattr(model, "module", model).base_model.embeddings
    if hasattr(embeddings, "create_position_ids_from_input_ids"):
        return int(embeddings.padding_idx) + 1
    return 0


def encode_packed(model, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """Final-layer vectors [rows, length, h] of padded ``ids`` / ``attention`` [rows, length] (each row's tokens
    first, then pads), computed on the rows packed into one (``use_packed_attention``); zeros at pads."""
    valid = attention.bool()
    lengths = valid.sum(1)
    if bool((valid.int().diff(dim=1) > 0).any()):
        raise ValueError("packed encoding needs each row's tokens before its padding")
    bounds = torch.nn.functional.pad(lengths.cumsum(0), (1, 0))  # [rows + 1], the jagged tensor's offsets
    starts = bounds[:-1].repeat_interleave(lengths)
    positions = torch.arange(len(starts), device=ids.device) - starts + first_position(model)
    hidden = model(input_ids=ids[valid].unsqueeze(0), position_ids=positions.unsqueeze(0),
                   cu_seq_lens_q=bounds, cu_seq_lens_k=bounds, max_length_q=int(lengths.max()),
                   max_length_k=int(lengths.max())).last_hidden_state[0]
    return hidden.new_zeros(*ids.shape, hidden.shape[-1]).index_put((valid,), hidden)
