"""BERT's masked language model (Devlin et al. 2019, section 3.1, "Task #1: Masked LM").

A BERT encoder built from random weights and its MLM prediction head ``W`` (a transform, then
the output projection tied to the word embeddings, as ``BertForMaskedLM``), trained to predict
the tokens selected in each sequence::

    h   = BERT(x~)                                  x~: x with 15% of its tokens selected, of
                                                    those 80% [MASK], 10% random, 10% kept
    L   = mean over selected i of CE(W h_i, x_i)    (section 3.1; BERT's own mean, as the
                                                    papers' sums normalised by the count)

The masking is :mod:`dprflow.pretraining.masking`; the loss is
:func:`dprflow.pretraining.backbone.mlm_loss` (only the selected positions go through ``W``).
Next-sentence prediction (section 3.1, Task #2) is left out: no method here reads it (and
RoBERTa found it does not help, Liu et al. 2019, section 4.2).

Shapes: ``B`` sequences of ``L`` tokens, hidden size ``H``, vocabulary ``V``.

A saved model is the folder of a ``BertForMaskedLM`` with BERT's pooler (untrained, as no
next-sentence task trains it) kept beside the encoder, so that each loader finds every weight it
builds::

    config.json, model.safetensors, tokenizer files
        AutoModel.from_pretrained               the encoder and its pooler (a plain BERT)
        BertForMaskedLM.from_pretrained         the encoder and the MLM head (the pooler unused):
                                                what Condenser and the MAEs start from
                                                (dprflow.pretraining.backbone.backbone_with_mlm_head)

It has no sentence-transformers configuration: a retriever started from it pools [CLS] and
scores with the dot product (dprflow.finetuning.biencoder's default).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from dprflow.pretraining.backbone import check_backbone, freeze_pooler, masked_lm, mlm_loss
from dprflow.pretraining.masking import IGNORE_INDEX

log = logging.getLogger(__name__)

WEIGHTS = "model.safetensors"
# The decoder's weight is the word embeddings' and its bias the head's own ``bias``: not stored.
TIED = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}


@dataclass
class MLMConfig:
    """The architecture of the MLM base (config ``model.mlm``; BERT-base is 12 / 768 / 12 / 3072 / 512)."""

    vocab_size: int  # the tokenizer's vocabulary (BERT uncased WordPiece: 30,522)
    layers: int = 4  # Transformer layers
    hidden_size: int = 256  # H
    heads: int = 4  # attention heads (H / heads dimensions each)
    intermediate_size: int = 1024  # feed-forward size (4 H, as BERT)
    max_length: int = 160  # position embeddings: the longest sequence, [CLS] and [SEP] included
    pad_token_id: int = 0

    def __post_init__(self) -> None:
        if self.hidden_size % self.heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of heads {self.heads} "
                "(model.mlm.hidden_size, model.mlm.heads)"
            )

    def bert_config(self) -> Any:
        """The Hugging Face ``BertConfig``: BERT's dropout (0.1), GELU and initialiser range (0.02)."""
        from transformers import BertConfig

        return BertConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            intermediate_size=self.intermediate_size,
            max_position_embeddings=self.max_length,
            pad_token_id=self.pad_token_id,
        )


class MaskedLanguageModel(nn.Module):
    """BERT and its MLM head, trained with the masked-token loss (Devlin et al. 2019, section 3.1).

    Args:
        lm: a Hugging Face ``BertForMaskedLM``; BERT's pooler is added when it has none (built
            from torch's global generator: seed it first) and frozen (no loss reaches it).

    Example::

        set_seed(13)
        model = MaskedLanguageModel.new(MLMConfig(vocab_size=len(tokenizer)))
        batch = mlm_batch(chunks, tokenizer, rng)          # [CLS] chunk [SEP], BERT masking
        loss = model(**batch)
        loss.backward()
        model.save_pretrained("mlm", tokenizer)            # AutoModel.from_pretrained("mlm"): the BERT
    """

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        check_backbone(lm.bert, "MLM pre-training")
        if lm.bert.pooler is None:
            from transformers.models.bert.modeling_bert import BertPooler

            lm.bert.pooler = BertPooler(lm.config)
            lm.bert.pooler.apply(lm._init_weights)
        freeze_pooler(lm.bert)
        self.lm = lm

    @classmethod
    def new(cls, config: MLMConfig) -> MaskedLanguageModel:
        """Random weights from torch's global generator (the same seed gives the same model)."""
        from transformers import BertForMaskedLM

        return cls(BertForMaskedLM(config.bert_config()))

    @classmethod
    def continued(cls, name_or_path: str | Path) -> MaskedLanguageModel:
        """A BERT checkpoint (a folder, a packaged model's name or a hub id) whose masked-LM
        pre-training continues (method mlm): its MLM head where it has one, else a fresh head
        (:func:`~dprflow.pretraining.backbone.masked_lm`; seed torch first), and BERT's pooler
        as in ``__init__`` (``BertForMaskedLM`` builds none)."""
        from dprflow.models.init import resolve_model

        lm = masked_lm(resolve_model(str(name_or_path)))
        if not hasattr(lm, "bert"):
            raise ValueError(
                f"{name_or_path}: a {type(lm).__name__}; continued MLM pre-training supports BERT encoders"
            )
        return cls(lm)

    @property
    def config(self) -> Any:
        return self.lm.config

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``[B, L, H]`` the encoder's last hidden states."""
        return self.lm.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        """The masked-token loss of a batch (section 3.1), a scalar.

        Args:
            input_ids: ``[B, L]`` masked token ids (:func:`dprflow.pretraining.masking.mask_tokens`).
            attention_mask: ``[B, L]``, 0 at padding.
            labels: ``[B, L]`` original ids at the selected positions, -100 elsewhere.
        """
        return mlm_loss(self.lm.cls, self.hidden_states(input_ids, attention_mask), labels)

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        self.lm.gradient_checkpointing_enable(**kwargs)

    # -- save and load ----------------------------------------------------------------------------
    def save_pretrained(self, out_dir: str | Path, tokenizer: Any = None, extra: dict | None = None) -> None:
        """Write the ``BertForMaskedLM`` folder (pooler included) and the tokenizer into
        ``out_dir`` as it is; the caller writes to a temporary folder and renames it (the trainer
        writes the training arguments, ``extra``, beside it)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.lm.save_pretrained(out)
        if tokenizer is not None:
            tokenizer.save_pretrained(out)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> MaskedLanguageModel:
        """A model saved by :meth:`save_pretrained`: the architecture from its ``config.json``,
        every weight from its ``model.safetensors`` (the tied decoder from the embeddings)."""
        from safetensors.torch import load_file
        from transformers import BertConfig, BertForMaskedLM

        path = Path(path)
        model = cls(BertForMaskedLM(BertConfig.from_pretrained(path)))
        missing, unexpected = model.lm.load_state_dict(load_file(path / WEIGHTS), strict=False)
        if unexpected or set(missing) - TIED:
            raise ValueError(
                f"{path / WEIGHTS}: not a saved MLM base, missing {sorted(set(missing) - TIED)[:5]}, "
                f"unexpected {sorted(unexpected)[:5]}"
            )
        return model


class MaskedTokenScore(NamedTuple):
    """The masked-token loss and accuracy over a set of masked batches."""

    loss: float  # mean cross-entropy over the selected positions (nats)
    accuracy: float  # share of the selected positions whose most likely token is the original
    masked_tokens: int  # selected positions scored

    def as_dict(self) -> dict[str, Any]:
        return self._asdict()


@torch.no_grad()
def masked_token_score(
    model: MaskedLanguageModel, batches: Iterable[dict[str, torch.Tensor]]
) -> MaskedTokenScore:
    """Loss and accuracy of ``model`` on masked ``batches`` (``input_ids``, ``attention_mask``,
    ``labels``), in eval mode (no dropout), every selected position weighted alike; the model's
    training mode is put back. Give the same batches (the same masks) to compare two models."""
    training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, correct, count = 0.0, 0, 0
    try:
        for batch in batches:
            labels = batch["labels"].to(device)
            hidden = model.hidden_states(batch["input_ids"].to(device), batch["attention_mask"].to(device))
            selected = labels != IGNORE_INDEX  # [B, L]
            logits = model.lm.cls(hidden[selected]).float()  # [M, V]
            targets = labels[selected]  # [M]
            total += F.cross_entropy(logits, targets, reduction="sum").item()
            correct += int((logits.argmax(dim=-1) == targets).sum())
            count += int(selected.sum())
    finally:
        model.train(training)
    if not count:
        raise ValueError("no masked token to score")
    return MaskedTokenScore(total / count, correct / count, count)
