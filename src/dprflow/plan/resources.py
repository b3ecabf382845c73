"""What the jobs ask a cluster for: memory (MB) and runtime (minutes) from the config's sizes, and
how a training job starts its stage (issue 53).

The jobs whose needs grow with the corpus or the batch ask for what a paper-scale config needs and
the default run for little. The rates are deliberately slow estimates (a busy GPU node); a
profile's ``set-resources`` overrides any rule. A collection's size is its ``size`` entry where
the config gives one (``size: {passages, train_queries}``: the presets), else 3 passages a
document of ``max_documents``, else a million passages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

EMBED_BYTES = 768 * 4  # one float32 vector of a BERT-base encoder
ENCODE_PER_S = 500  # passages encoded per second
TRAIN_SEQ_MB = 20  # host memory per sequence of a training step
STEP_S = 2.0  # seconds per training step


def training_launcher(wildcards: Any, resources: Mapping[str, Any]) -> str:
    """How a training job starts its stage: ``python`` for one process, or ``torchrun`` with one
    process per GPU when the job holds several (``resources: gpu``, set in a profile). The stage
    code is the same; DDP and the cross-device gathering of negatives start from torchrun's
    environment (dprflow.training.distributed)."""
    gpus = int(resources.get("gpu", 0) or 0)
    if gpus <= 1:
        return "python"
    return f"torchrun --standalone --nproc-per-node {gpus}"  # an int: nothing to quote


class ResourceEstimates:
    """The resource functions of the rules, for ``config``; each takes the job's wildcards."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.collections = config["collections"]
        self.ft = config["finetune"]
        self.heap_mb = config["bm25"]["heap_mb"]

    # ------------------------------------------------------------------------ sizes
    def passages(self, collection: str) -> int:
        spec = self.collections[collection]
        size = spec.get("size", {}).get("passages")
        if size:
            return size
        if spec.get("max_documents"):
            return 3 * spec["max_documents"]
        return 1_000_000

    def train_queries(self, collection: str) -> int:
        spec = self.collections[collection]
        return spec.get("size", {}).get("train_queries") or max(1, self.passages(collection) // 10)

    def train_steps(self, section: Mapping[str, Any], collection: str) -> int:
        if section["max_steps"]:
            return section["max_steps"]
        per_epoch = self.train_queries(collection) // section["batch_size"] + 1
        return section["epochs"] * per_epoch

    def training(self, section: Mapping[str, Any], collection: str) -> tuple[int, int]:
        """(memory MB, runtime minutes) of a training job of a fine-tuning ``section``."""
        sequences = section["batch_size"] * section.get("group_size", 1)
        mem = int(4000 + TRAIN_SEQ_MB * sequences)
        runtime = int(30 + self.train_steps(section, collection) * STEP_S * max(1, sequences / 64) / 60)
        return mem, runtime

    # ------------------------------------------------------------------------- BM25
    def bm25_heap_mb(self, wildcards: Any) -> int:
        # A resource, not a param: a larger heap changes no output, so it must not rerun the jobs.
        return self.heap_mb

    def bm25_mem_mb(self, wildcards: Any) -> int:
        # The JVM's heap, plus its own memory and Python's (one batch of passages or one call's
        # hits, about 0.5 GB measured), plus the index's memory-mapped pages (70 bytes a passage
        # measured; 100 asked).
        return int(self.heap_mb + 1536 + self.passages(wildcards.collection) / 10_000)

    def bm25_runtime(self, wildcards: Any) -> int:
        return int(15 + self.passages(wildcards.collection) / 60_000)

    # ---------------------------------------------------------- dense encoding, search
    def _per_shard(self, collection: str) -> int:
        return self.passages(collection) // self.ft["encode_shards"] + 1

    def encode_mem_mb(self, wildcards: Any) -> int:
        return int(3000 + 3 * self._per_shard(wildcards.collection) * EMBED_BYTES / 2**20)

    def encode_runtime(self, wildcards: Any) -> int:
        return int(15 + self._per_shard(wildcards.collection) / ENCODE_PER_S / 60)

    def search_mem_mb(self, wildcards: Any) -> int:
        """The whole flat index is held at once, or one shard of it with
        finetune.search_shard_at_a_time (queries are searched in batches)."""
        held = self.passages(wildcards.collection)
        if self.ft["search_shard_at_a_time"]:
            held /= self.ft["encode_shards"]
        return int(3000 + 1.5 * held * EMBED_BYTES / 2**20)

    def search_runtime(self, wildcards: Any) -> int:
        return int(15 + self.passages(wildcards.collection) / 200_000)

    # ----------------------------------------------------------------------- reranker
    def rerank_runtime(self, wildcards: Any) -> int:
        """K3 pairs per query; the evaluation queries are at most a tenth of the training ones here."""
        pairs = self.ft["reranker"]["depth"] * max(1000, self.train_queries(wildcards.collection) // 10)
        return int(15 + pairs / ENCODE_PER_S / 60)
