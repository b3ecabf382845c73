"""Padding-free (packed) Transformer steps: a batch's real tokens as one sequence.

A padded batch of ``B`` sequences of at most ``L`` tokens runs every matrix product over
``B x L`` positions; at the benchmark's lengths a quarter of them are padding (bench/RESULTS.md,
"Feeding the steps"). A packed step runs the same layers over the ``T`` real tokens only: the
sequences concatenated, positions restarting at 0 in each, and an attention that never crosses
from one sequence into another, given by the cumulative lengths ``cu_seqlens`` (``[0, l_0,
l_0 + l_1, ...]``), as MosaicBERT and ModernBERT train BERT-style encoders. Without dropout the
outputs are the padded batch's outputs at its real positions, to float rounding
(tests/test_packed.py on a CPU, tests/test_gpu.py on a GPU).

The attention over a packed batch (:func:`varlen_attention`):

- on a GPU in bf16 or fp16: ``torch.nn.attention.varlen.varlen_attn`` (torch 2.10 and later:
  FlashAttention's variable-length forward and backward, no ``T x T`` scores);
- elsewhere (a CPU, fp32, an older torch): a reference, torch's ``scaled_dot_product_attention``
  over each sequence in turn; the same function, slower.

``varlen_attn`` has no dropout, so neither has the reference: a packed step drops no attention
probabilities (BERT's ``attention_probs_dropout_prob``); every other dropout (embeddings, after
the attention and the feed-forward block) is drawn as in the padded step. ModernBERT trains with
attention dropout 0. docs/training.md says where this path is used (``training.attention:
packed``).

The layers are BERT's own modules called on the packed tokens (:func:`packed_layer`), so the
weights, their names and the saved checkpoints are those of the padded model.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

PACKED = "packed"  # the training.attention value that selects this path
_HALF = (torch.bfloat16, torch.float16)


@functools.cache
def varlen_kernel() -> Any:
    """torch's variable-length attention (``varlen_attn``), or ``None`` where this torch lacks it
    (looked up once: every packed layer of every step asks)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # torch < 2.10
        return None
    return varlen_attn


def attention_backend(device_type: str, dtype: torch.dtype, has_kernel: bool) -> str:
    """``"varlen"`` (the GPU kernel) or ``"reference"`` (per-sequence SDPA) for a packed batch's
    attention: the kernel runs on CUDA in bf16 or fp16 only."""
    if device_type == "cuda" and dtype in _HALF and has_kernel:
        return "varlen"
    return "reference"


@dataclass(frozen=True)
class Packing:
    """Where a padded ``[B, L]`` batch's real tokens go in a packed ``[T]`` one.

    ``index``: the real tokens' positions in the flattened ``B x L`` batch, row by row; ``rows``:
    the row of each; ``positions``: each token's position in its row (the padded model's position
    ids, so left padding packs as well as right); ``cu_seqlens``: ``[B + 1]`` int32 cumulative
    lengths; ``max_len``: an upper bound of the lengths (``L``: no host sync to find it).
    """

    index: torch.Tensor
    rows: torch.Tensor
    positions: torch.Tensor
    cu_seqlens: torch.Tensor
    shape: tuple[int, int]
    mlm: torch.Tensor | None = None  # the packed positions with an MLM target, when labels were given

    @classmethod
    def of(cls, attention_mask: torch.Tensor, targets: torch.Tensor | None = None) -> Packing:
        """The packing of a batch whose ``attention_mask`` is 1 at its real tokens (and, given
        ``targets``, True where the batch has an MLM target, where those lie). On a GPU this waits
        for the device once (``nonzero``: how many tokens there are); built on the host with the
        batch (:func:`dprflow.training.batches.with_packing`), it never does."""
        if attention_mask.dim() != 2:
            raise ValueError(
                f"a packed batch needs a [B, L] attention mask; got shape {tuple(attention_mask.shape)}"
            )
        mask = attention_mask.bool()
        lengths = mask.sum(dim=1, dtype=torch.int32)
        cu_seqlens = F.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
        index = mask.flatten().nonzero().squeeze(1)
        length = mask.shape[1]
        mlm = None
        if targets is not None:
            mlm = targets.flatten()[index].nonzero().squeeze(1)
        return cls(index, index // length, index % length, cu_seqlens, (mask.shape[0], length), mlm)

    @classmethod
    def usable(cls, given: Packing | None, attention_mask: torch.Tensor) -> Packing:
        """``given`` (built with the batch) when it is this batch's, else one made now: a
        micro-batch or a gradient-cache chunk holds fewer rows than the batch it was cut from."""
        if given is not None and given.shape == tuple(attention_mask.shape):
            return given
        return cls.of(attention_mask)

    def to(self, device: torch.device | str, non_blocking: bool = True) -> Packing:
        return dataclasses.replace(
            self, **{k: v.to(device, non_blocking=non_blocking) for k, v in self._tensors()}
        )

    def pin_memory(self) -> Packing:
        """Page-locked copies (the DataLoader calls this on a batch's objects): copied to the GPU
        without making the host wait."""
        return dataclasses.replace(self, **{k: v.pin_memory() for k, v in self._tensors()})

    def _tensors(self) -> list[tuple[str, torch.Tensor]]:
        fields = ("index", "rows", "positions", "cu_seqlens", "mlm")
        return [(k, getattr(self, k)) for k in fields if getattr(self, k) is not None]

    @property
    def max_len(self) -> int:
        return self.shape[1]

    @property
    def first(self) -> torch.Tensor:
        """``[B]`` positions in the packed batch of each sequence's first token ([CLS])."""
        return self.cu_seqlens[:-1].long()

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, L, ...]`` -> ``[T, ...]``: the real positions' values."""
        return x.flatten(0, 1)[self.index]

    def unpack(self, x: torch.Tensor, fill: float = 0) -> torch.Tensor:
        """``[T, ...]`` -> ``[B, L, ...]``, ``fill`` at the padding."""
        out = x.new_full((self.shape[0] * self.shape[1], *x.shape[1:]), fill)
        return out.index_copy(0, self.index, x).unflatten(0, self.shape)

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        """``[T, H]`` -> ``[B, H]``: each sequence's mean token vector (mean pooling)."""
        sums = x.new_zeros(self.shape[0], x.shape[1]).index_add(0, self.rows, x)
        lengths = (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).clamp(min=1)
        return sums / lengths[:, None].to(x.dtype)


def varlen_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, packing: Packing
) -> torch.Tensor:
    """Attention within each packed sequence: ``[T, heads, d]`` each -> ``[T, heads, d]``, scores
    scaled by ``1 / sqrt(d)`` (BERT's; both kernels' default: torch 2.10's ``varlen_attn`` takes
    no other)."""
    kernel = varlen_kernel()
    if attention_backend(query.device.type, query.dtype, kernel is not None) == "varlen":
        cu, n = packing.cu_seqlens, packing.max_len
        return kernel(query, key, value, cu, cu, n, n)
    bounds = packing.cu_seqlens.tolist()
    parts = []
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        q, k, v = (t[start:end].transpose(0, 1) for t in (query, key, value))  # [heads, l, d]
        parts.append(F.scaled_dot_product_attention(q, k, v).transpose(0, 1))
    return torch.cat(parts)


def check_packable(model: nn.Module, what: str) -> None:
    """Refuse a model the packed path cannot run: it calls BERT's modules (embeddings, layers
    with ``attention.self``) and absolute positions."""
    config = getattr(model, "config", None)
    layers = getattr(getattr(model, "encoder", None), "layer", None)
    kind = getattr(config, "position_embedding_type", "absolute")
    if config is None or layers is None or not hasattr(model, "embeddings") or kind != "absolute":
        raise ValueError(
            f"training.attention: {PACKED} runs BERT encoders with absolute positions; {what} is a "
            f"{type(model).__name__} (model_type {getattr(config, 'model_type', None)!r}, positions "
            f"{kind!r}): use sdpa"
        )


def packed_embeddings(
    model: nn.Module, input_ids: torch.Tensor, packing: Packing, token_type_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """``[T, H]``: BERT's embeddings (word + position + token type, LayerNorm, dropout) of the
    packed tokens, each at its position in its own sequence."""
    types = None if token_type_ids is None else packing.pack(token_type_ids)[None]
    if types is None:
        types = torch.zeros_like(packing.positions)[None]
    hidden = model.embeddings(
        input_ids=packing.pack(input_ids)[None], token_type_ids=types, position_ids=packing.positions[None]
    )
    return hidden[0]


def packed_layer(layer: nn.Module, hidden: torch.Tensor, packing: Packing) -> torch.Tensor:
    """One ``BertLayer`` over packed tokens ``[T, H]``: its own modules, the attention within each
    sequence (:func:`varlen_attention`; no attention-probability dropout). With the layer's
    gradient checkpointing on (``gradient_checkpointing_enable``), recomputed in the backward."""
    if getattr(layer, "gradient_checkpointing", False) and torch.is_grad_enabled():
        return checkpoint(_packed_layer, layer, hidden, packing, use_reentrant=False)
    return _packed_layer(layer, hidden, packing)


def _packed_layer(layer: nn.Module, hidden: torch.Tensor, packing: Packing) -> torch.Tensor:
    attention = layer.attention.self
    heads, size = attention.num_attention_heads, attention.attention_head_size
    q, k, v = (
        proj(hidden).view(-1, heads, size) for proj in (attention.query, attention.key, attention.value)
    )
    if getattr(attention, "scaling", size**-0.5) != size**-0.5:
        raise ValueError(
            f"{type(attention).__name__} scales its scores by {attention.scaling}, not 1/sqrt({size})"
        )
    context = varlen_attention(q, k, v, packing).reshape(len(hidden), heads * size)
    attended = layer.attention.output(context, hidden)  # dense, dropout, residual, LayerNorm
    return layer.output(layer.intermediate(attended), attended)  # the feed-forward block, likewise


def packed_states(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    token_type_ids: torch.Tensor | None = None,
    packing: Packing | None = None,
) -> tuple[torch.Tensor, Packing]:
    """``(last hidden states [T, H], packing)`` of a BERT encoder over a padded batch's real tokens:
    ``AutoModel``'s ``last_hidden_state[mask]`` without the padding's work."""
    packing = Packing.usable(packing, attention_mask)
    hidden = packed_embeddings(model, input_ids, packing, token_type_ids)
    for layer in model.encoder.layer:
        hidden = packed_layer(layer, hidden, packing)
    return hidden, packing


def set_packed(model: nn.Module, packed: bool) -> list[str]:
    """Every module of ``model`` with a packed path (a ``packed`` attribute: the retriever's
    :class:`~dprflow.finetuning.biencoder.BiEncoder`, the Condenser) switched to it or back; the
    names of their classes (empty: ``model`` has none, and stays padded)."""
    switched = []
    for module in model.modules():
        if hasattr(module, "packed") and hasattr(module, "check_packable"):
            if packed:
                module.check_packable()
            module.packed = packed
            switched.append(type(module).__name__)
    return switched
