"""Stage ``train_retriever``: a bi-encoder trained on hard negatives (retriever 1, retriever 2),
or distilled from the reranker's scores (``--teacher``).

Loss: softmax cross-entropy of the positive against in-batch and hard negatives (CDMAE eq. 10,
coCondenser section 3.4); with ``--teacher``, KL to the reranker's distribution over each
query's group plus alpha times that contrastive loss (CDMAE eq. 11 and section 3.4). With
``--chunk-size`` the batch is encoded in chunks with a gradient cache (same gradient, the memory
of one chunk); with ``--gradient-accumulation-steps`` each micro-batch has its own in-batch
negatives (see :class:`dprflow.training.trainer.Trainer`).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dprflow.cli import run_stage
from dprflow.errors import StageError
from dprflow.files import scratch_dir
from dprflow.finetuning.biencoder import BiEncoder, load_tokenizer, model_prompts
from dprflow.finetuning.examples import GroupTrainingArgs, read_training_examples, sample_group
from dprflow.finetuning.losses import contrastive_loss, distillation_loss
from dprflow.finetuning.pretokenized import GroupTokens, from_ids_if_same, single_batch
from dprflow.finetuning.selection import apply_selections
from dprflow.training import distributed
from dprflow.training.memory import (
    EncoderShape,
    StepMemory,
    check_training_memory,
    contrastive_cache_bytes,
    holds_gradients,
    per_process,
    world_size,
)
from dprflow.training.steps import biencoder_step
from dprflow.training.trainer import train_and_save

log = logging.getLogger("dprflow.train_retriever")


@dataclass(kw_only=True)
class Args(GroupTrainingArgs):
    """Fine-tune a bi-encoder retriever."""

    extra_negatives: str | None = field(
        default=None, metadata={"help": "a second pool (BM25 for retriever 2)"}
    )
    extra_fraction: float = field(default=0.0, metadata={"help": "share of negatives from the second pool"})
    teacher: str | None = field(default=None, metadata={"help": "reranker scores: distillation mode"})
    pooling: str | None = field(
        default=None,
        metadata={
            "help": "cls or mean (default: the initial model's own, else cls)",
            "choices": ["cls", "mean"],
        },
    )
    similarity: str | None = field(
        default=None,
        metadata={
            "help": "dot or cosine (default: the initial model's own, else dot)",
            "choices": ["dot", "cosine"],
        },
    )
    temperature: float | None = field(
        default=None,
        metadata={"help": "contrastive softmax temperature (default: 1 for dot, 0.05 for cosine)"},
    )
    shared: bool = field(default=True, metadata={"help": "siamese towers"})
    method: str | None = field(default=None, metadata={"help": "pre-training method, for the model card"})
    role: str | None = field(
        default=None,
        metadata={"help": "r1, r2 or distill, for the model card", "choices": ["r1", "r2", "distill"]},
    )
    alpha: float = field(default=0.2, metadata={"help": "distillation: weight of the contrastive loss"})
    direction: str = field(
        default="teacher_student",
        metadata={"help": "distillation KL direction", "choices": ["teacher_student", "student_teacher"]},
    )
    student_over: str = field(
        default="group",
        metadata={
            "help": "distillation: the student's distribution over the query's group (CDMAE eq. 11) "
            "or over every passage of the batch (coCondenser 5.1, KL(T||S))",
            "choices": ["group", "batch"],
        },
    )
    max_query_length: int = field(default=32, metadata={"help": "query tokens"})
    max_passage_length: int = field(default=144, metadata={"help": "passage tokens"})
    chunk_size: int = field(
        default=0,
        metadata={
            "help": "gradient cache: encode this many queries / passages at a time, with the full "
            "batch's gradient (0: the whole batch at once)"
        },
    )

    def check(self) -> None:
        if self.group_size < 1 or (self.teacher and self.group_size < 2):
            raise ValueError("--group-size must be >= 1 (>= 2 when distilling)")
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(f"--temperature must be > 0, got {self.temperature}")
        if self.student_over == "batch" and self.direction != "teacher_student":
            raise ValueError("--student-over batch needs --direction teacher_student (KL(S||T) is infinite)")
        if self.chunk_size < 0:
            raise ValueError(f"--chunk-size must be >= 0, got {self.chunk_size}")


def step_memory(args: Args, shape: EncoderShape, world: int | None = None) -> StepMemory:
    """What a step of one process holds: its queries and passages (one micro-batch of them), or
    with the gradient cache one chunk of the larger side plus every embedding, the scores and
    their gradients (in-batch negatives: each query against the passages of all processes)."""
    world = world_size() if world is None else world
    k, chunk = args.gradient_accumulation_steps, args.chunk_size
    queries = per_process(args.batch_size, world, k)
    passages = per_process(args.batch_size * args.group_size, world, k)
    q_len, p_len = args.max_query_length, args.max_passage_length
    if not chunk or (chunk >= queries and chunk >= passages):
        return StepMemory(
            ((queries, q_len), (passages, p_len)),
            checkpointing=args.gradient_checkpointing,
            accumulates=holds_gradients(k, queries),
        )
    sides = [(min(queries, chunk), q_len), (min(passages, chunk), p_len)]
    return StepMemory(
        (max(sides, key=lambda side: side[0] * side[1]),),
        buffer_bytes=contrastive_cache_bytes(queries, passages * world, shape.hidden_size),
        checkpointing=args.gradient_checkpointing,
        accumulates=True,  # the gradient cache: one chunk's backward before the next's forward
    )


def train(args: Args) -> None:
    if args.selection:  # settings chosen on held-out training queries (docs/selection.md)
        chosen = apply_selections(args, args.selection, ("retriever", "negatives", "distill"))
        args.check()
        log.info("settings chosen on held-out queries (%s): %s", ", ".join(args.selection), chosen)
    with scratch_dir(args.out) as scratch:  # the passages' texts, read a batch at a time
        fine_tune(args, scratch)


def fine_tune(args: Args, scratch: str) -> None:
    """The initial model, its training groups, a check that a step fits, then the training."""
    if args.threads:
        torch.set_num_threads(args.threads)
    refuse_prompts(args.init)
    tokenizer = load_tokenizer(args.init)
    model = BiEncoder.from_pretrained(
        args.init,
        pooling=args.pooling,
        shared=args.shared,
        similarity=args.similarity,
        temperature=args.temperature,
    )
    # The resolved geometry is what was trained: record it with the arguments and in the model.
    args.pooling, args.similarity, args.temperature = model.pooling, model.similarity, model.temperature
    log.info(
        "geometry: %s pooling, %s similarity, temperature %g (%s)",
        args.pooling,
        args.similarity,
        args.temperature,
        model.source,
    )
    items, counts, texts = read_training_examples(
        args, tokenizer, scratch, args.extra_negatives, args.teacher
    )
    section = "finetune.distill" if args.teacher else "finetune.retriever"
    check_training_memory(
        model,
        step_memory(args, EncoderShape.of(model)),
        args.mem_mb,
        [f"{section}.batch_size", f"{section}.group_size", "finetune.max_passage_length"],
        args.precision,
        chunk_key=f"{section}.chunk_size",
        attention=args.attention,
    )
    batches = GroupBatches(args, tokenizer, texts)
    train_items, make_batch = batches.from_ids_or_texts(items, Path(scratch) / "tokens")
    step = RetrieverStep(args, model.temperature)
    train_and_save(
        model,
        train_items,
        make_batch,
        step,
        BiEncoder,
        tokenizer,
        args,
        {"training_queries": counts},
        manual_backward=True,
    )


def refuse_prompts(init: str) -> None:
    prompts = model_prompts(init)
    if any(prompts.values()):
        raise StageError(
            f"{init} puts prompts before its inputs ({prompts}; config_sentence_transformers.json); "
            "fine-tuning does not add them, so the trained model would be fed other inputs than it was "
            "made for: start from a model without prompts (its off-the-shelf row, model.references, "
            "uses them)"
        )


class GroupBatches:
    """A batch of queries, each with its group (a positive and ``group_size - 1`` negatives), as
    the queries' and the passages' model inputs and, when distilling, the teacher's scores of
    the groups: tokenized per batch (``from_texts``) or assembled from ids tokenized once."""

    def __init__(self, args: Args, tokenizer, texts) -> None:
        self.args, self.tokenizer, self.texts = args, tokenizer, texts
        self.tokens: GroupTokens | None = None

    def draw(self, rng, batch_items):
        """Each query's group, and the teacher's scores of the groups when distilling."""
        groups = [sample_group(rng, it, self.args.group_size, self.args.extra_fraction) for it in batch_items]
        teacher = None
        if self.args.teacher:
            teacher = torch.tensor(
                [[it.teacher[pid] for pid in g] for it, g in zip(batch_items, groups, strict=True)]
            )
        return groups, teacher

    def from_texts(self, rng, batch_items):
        groups, teacher = self.draw(rng, batch_items)
        tokenize = dict(truncation=True, padding=True, return_tensors="pt")
        q = self.tokenizer([it.text for it in batch_items], max_length=self.args.max_query_length, **tokenize)
        p = self.tokenizer(
            [self.texts[pid] for g in groups for pid in g],
            max_length=self.args.max_passage_length,
            **tokenize,
        )
        return q, p, teacher

    def from_ids(self, rng, indexed):
        groups, teacher = self.draw(rng, [it for _, it in indexed])
        q = single_batch(
            [self.tokens.queries[i] for i, _ in indexed], self.tokenizer, self.args.max_query_length
        )
        p = single_batch(
            [self.tokens.passages[pid] for g in groups for pid in g],
            self.tokenizer,
            self.args.max_passage_length,
        )
        return q, p, teacher

    def from_ids_or_texts(self, items, folder: Path):
        """The training items and their ``make_batch``: from ids made once when
        ``--pretokenize`` (the same batches, checked on the first; finetuning/pretokenized.py)."""
        if not self.args.pretokenize:
            return items, self.from_texts
        a = self.args
        self.tokens = GroupTokens(
            items, self.texts, self.tokenizer, a.max_query_length - 2, a.max_passage_length - 2, folder
        )
        return from_ids_if_same("train_retriever", items, self.from_ids, self.from_texts)


class RetrieverStep:
    """A step's loss over a batch: contrastive, or distillation when the batch carries the
    teacher's scores; each process's queries against the passages of every process."""

    def __init__(self, args: Args, temperature: float) -> None:
        self.args, self.temperature = args, temperature

    def loss(self, q, p, teacher):
        rank, world = distributed.get_rank(), distributed.get_world_size()
        offset = rank * q.size(0)
        p_all = distributed.gather_with_grad(p) if world > 1 else p
        a = self.args
        if teacher is None:
            return contrastive_loss(
                q, p_all, group_size=a.group_size, temperature=self.temperature, rank_offset=offset
            )
        return distillation_loss(
            q,
            p_all,
            teacher,
            group_size=a.group_size,
            alpha=a.alpha,
            temperature=self.temperature,
            direction=a.direction,
            rank_offset=offset,
            student_over=a.student_over,
        )

    def __call__(self, m, batch, backward):
        q_in, p_in, teacher = batch
        device = next(m.parameters()).device
        teacher = None if teacher is None else teacher.to(device)
        return biencoder_step(
            m,
            q_in.to(device),
            p_in.to(device),
            lambda q, p: self.loss(q, p, teacher),
            self.args.chunk_size,
            backward,
        )


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, train, argv, "train_retriever")


if __name__ == "__main__":
    sys.exit(main())
