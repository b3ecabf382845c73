"""Stage ``export_faiss``: a dense row's corpus embeddings as a faiss index folder for pyserini.

Writes ``<out>/index`` (a faiss ``IndexFlatIP`` of the passage embeddings, exact inner product as
the bi-encoder was trained) and ``<out>/docid`` (the passage ids, one a line), the layout of
``pyserini.search.faiss.FaissSearcher(<out>, query_encoder)``. The query encoder is the row's
model folder, with the pooling and precision recorded there.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from dprflow.cli import run_stage
from dprflow.search.dense import FlatIndex, write_faiss_index

log = logging.getLogger("dprflow.export_faiss")


@dataclass
class Args:
    """Write a pyserini FaissSearcher folder from embedding shards."""

    embeddings: list[str] = field(metadata={"help": "the corpus shards, all of them"})
    out: str = field(metadata={"help": "folder to write (index, docid)"})


def export(args: Args) -> None:
    index = FlatIndex.from_files(args.embeddings)
    write_faiss_index(index, args.out)
    log.info("faiss index of %d passages (dimension %d) in %s", index.ntotal, index.dim, args.out)


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, export, argv, "export_faiss")


if __name__ == "__main__":
    sys.exit(main())
