"""What the two Lucene search stages (bm25_search, bm25_negatives) share: their BM25 settings
and the queries of one split."""

from __future__ import annotations

from dataclasses import dataclass, field

from dprflow.data.schemas import read_table
from dprflow.errors import StageError


@dataclass(kw_only=True)
class LuceneArgs:
    """The BM25 settings and the Java-call size both Lucene search stages take."""

    k1: float = field(default=0.9, metadata={"help": "BM25 k1"})
    b: float = field(default=0.4, metadata={"help": "BM25 b"})
    threads: int = field(default=1, metadata={"help": "search threads"})
    hits_per_call: int = field(
        default=500_000,
        metadata={
            "help": "hits per Java call (queries per call: this over the depth): one call's hits are "
            "held at a time, so this bounds the memory of the JVM and of Python"
        },
    )
    heap_mb: int = field(
        default=4096,
        metadata={
            "help": "the JVM's heap (-Xmx) in MB: one call's hits must fit in it (2M hits ran in 1024)"
        },
    )

    def check(self) -> None:
        if self.hits_per_call < 1:
            raise ValueError(f"--hits-per-call must be at least 1, got {self.hits_per_call}")
        if self.heap_mb < 64:
            raise ValueError(f"--heap-mb must be at least 64, got {self.heap_mb}")


def split_queries(path: str, split: str):
    queries = read_table(path, "queries")
    chosen = queries[queries["split"] == split]
    if chosen.empty:
        raise StageError(f"{path}: no query of split {split!r}; splits: {sorted(set(queries['split']))}")
    return chosen
