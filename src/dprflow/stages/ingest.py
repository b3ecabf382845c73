"""Stage ``ingest``: a named collection becomes documents.parquet, queries.parquet and qrels.parquet.

The beir and ir_datasets sources stream their documents into documents.parquet batch by batch
(``--batch-documents``, ``--batch-chars``): memory holds one batch and the set of document ids that
the duplicate and qrels checks need. Every table appears only when the whole collection passed its
checks (the documents' writer is atomic and stays open until then).
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

from dprflow.cli import run_stage
from dprflow.data.collections import Collection, Documents
from dprflow.data.schemas import TableWriter, write_table
from dprflow.errors import StageError

log = logging.getLogger("dprflow.ingest")


@dataclass
class Args:
    """Load a test collection and write its three tables."""

    source: str = field(
        metadata={"help": "embedded, beir or ir_datasets", "choices": ["embedded", "beir", "ir_datasets"]}
    )
    out_dir: str = field(metadata={"help": "folder for documents/queries/qrels.parquet"})
    path: str | None = field(default=None, metadata={"help": "beir: the BEIR folder"})
    ir_datasets: str | None = field(
        default=None,
        metadata={"help": "ir_datasets: JSON object split -> dataset id; documents come from the first id"},
    )
    max_documents: int | None = field(default=None, metadata={"help": "embedded: keep a stable subset"})
    split_percent: list[int] = field(
        default_factory=lambda: [80, 10, 10],
        metadata={"help": "embedded: percentages of queries in train, dev and test"},
    )
    batch_documents: int = field(
        default=16384,
        metadata={"help": "beir, ir_datasets: documents read and written at a time (bounds memory)"},
    )
    batch_chars: int = field(
        default=1 << 23,
        metadata={
            "help": "beir, ir_datasets: a batch ends sooner when its titles and texts reach this many characters"
        },
    )

    def check(self) -> None:
        if self.source == "beir" and not self.path:
            raise ValueError("--path is required with --source beir")
        if self.source == "ir_datasets" and not self.ir_datasets:
            raise ValueError("--ir-datasets is required with --source ir_datasets")
        if self.batch_documents < 1:
            raise ValueError(f"--batch-documents must be at least 1, got {self.batch_documents}")
        if self.batch_chars < 1:
            raise ValueError(f"--batch-chars must be at least 1, got {self.batch_chars}")


def check_collection(col: Collection, where: str) -> None:
    """Checks common to every source: unique ids, qrels naming known queries and documents."""
    for name, table, key in (("documents", col.documents, "doc_id"), ("queries", col.queries, "query_id")):
        dup = table[key].duplicated()
        if dup.any():
            row = int(dup.to_numpy().nonzero()[0][0])
            raise StageError(f"{where}: duplicate {key} {table[key].iloc[row]!r} in {name} (row {row})")
    for key, table in (("doc_id", col.documents), ("query_id", col.queries)):
        unknown = ~col.qrels[key].isin(set(table[key]))
        if unknown.any():
            row = int(unknown.to_numpy().nonzero()[0][0])
            raise StageError(f"{where}: qrels row {row} names unknown {key} {col.qrels[key].iloc[row]!r}")


def load(args: Args, documents: Documents) -> tuple[Collection, str]:
    """The collection and where it came from; beir and ir_datasets hand their documents to
    ``documents`` (the embedded collection is small and built in memory)."""
    if args.source == "embedded":
        from dprflow.data.collections.embedded import build_embedded

        return build_embedded(
            max_documents=args.max_documents, split_percent=tuple(args.split_percent)
        ), f"embedded (Python {sys.version.split()[0]} stdlib)"
    if args.source == "beir":
        from dprflow.data.collections.beir import load_beir

        return load_beir(args.path, documents), args.path
    from dprflow.data.collections.irds import download_failure, load_ir_datasets

    splits = ir_datasets_splits(args.ir_datasets)
    # The documents of the first id (config: "documents come from the first"); every split's
    # queries and qrels from its own id.
    dataset_id = next(iter(splits.values()))
    try:
        return load_ir_datasets(dataset_id, splits, documents), args.ir_datasets
    except Exception as exc:
        failure = download_failure(exc, dataset_id)
        if failure is None:
            raise
        raise failure from None


def ir_datasets_splits(text: str) -> dict[str, str]:
    """The ``--ir-datasets`` JSON object (split -> id), checked: a non-empty object of strings."""
    try:
        splits = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StageError(f"--ir-datasets {text!r} is not JSON: {exc}") from exc
    if (
        not isinstance(splits, dict)
        or not splits
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in splits.items())
    ):
        raise StageError(
            f"--ir-datasets {text!r} must be a JSON object of split name -> ir_datasets id, "
            'e.g. {"train": "msmarco-passage/train/judged", "dev": "msmarco-passage/dev/small"}'
        )
    return splits


def ingest(args: Args) -> None:
    out = Path(args.out_dir)
    created = not out.exists()
    try:
        write_collection(args, out)
    except BaseException:
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # the writer made the folder; a failed ingest leaves nothing behind
        raise


def write_collection(args: Args, out: Path) -> None:
    with TableWriter(out / "documents.parquet", "documents") as writer:
        documents = Documents(writer.write, args.batch_documents, args.batch_chars)
        col, where = load(args, documents)
        empty = documents.empty
        if col.documents is not None:  # built in memory (embedded): checked and written here
            check_collection(col, where)
            writer.write(col.documents)
            blank = col.documents["title"].str.strip().eq("") & col.documents["text"].str.strip().eq("")
            empty = int(blank.sum())
        if not writer.rows or not len(col.queries):
            raise StageError(f"{where}: the collection has no documents or no queries")
        write_table(col.queries, out / "queries.parquet", "queries")
        write_table(col.qrels, out / "qrels.parquet", "qrels")
    splits = col.queries["split"].value_counts().to_dict()
    log.info(
        "collection %s: %d documents, %d queries %s, %d judgments",
        where,
        writer.rows,
        len(col.queries),
        splits,
        len(col.qrels),
    )
    for reason, n in sorted(col.counts.items()):
        log.info("count %s: %d", reason, n)
    log.info("documents with empty title and text: %d (kept; split_passages gives them no passage)", empty)


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, ingest, argv, "ingest")


if __name__ == "__main__":
    sys.exit(main())
