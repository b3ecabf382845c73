"""Stage ``export_faiss``: a dense row's corpus embeddings as a faiss index folder for pyserini.

Writes ``<out>/index`` (a faiss ``IndexFlatIP`` of the passage embeddings, exact inner product as
the bi-encoder was trained), ``<out>/docid`` (the passage ids, one a line), the layout of
``pyserini.search.faiss.FaissSearcher(<out>, query_encoder)``, and how to build that query
encoder so that it embeds queries as the row's search did: ``query_encoder.json`` (the model
folder, pooling, L2 normalisation, query length, passage format) and a ``README.md`` with the
exact pyserini call. Given the model path alone, pyserini's ``AutoQueryEncoder`` takes [CLS]
pooling without normalisation, which is wrong for every mean-pooled or cosine row.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

from dprflow.cli import run_stage
from dprflow.errors import StageError
from dprflow.models.init import load_tokenizer, resolve_model
from dprflow.models.st_format import PACKAGED_HUB_IDS
from dprflow.search.dense import FlatIndex, write_faiss_index

log = logging.getLogger("dprflow.export_faiss")

SETTINGS_FILE = "query_encoder.json"


@dataclass
class Args:
    """Write a pyserini FaissSearcher folder from embedding shards, with its query encoder's settings."""

    embeddings: list[str] = field(metadata={"help": "the corpus shards, all of them"})
    encoder: str = field(
        metadata={"help": "the row's encoder.json (model, pooling, similarity; search_dense)"}
    )
    max_query_length: int = field(metadata={"help": "query tokens, as the row's search cut them"})
    out: str = field(metadata={"help": "folder to write (index, docid, query_encoder.json, README.md)"})


def query_encoder_settings(encoder: dict, max_query_length: int) -> dict:
    """The arguments of pyserini's ``AutoQueryEncoder`` (and the query length to search with) that
    embed queries as dprflow's search did: ``encoder_dir`` (the query tower of a two-tower model),
    ``tokenizer_name``, ``pooling``, ``l2_norm`` (cosine rows), ``prefix`` (none: dprflow adds no
    query prefix), ``max_length``; and, for the documents, how a passage's text was built."""
    from dprflow.finetuning.biencoder import QUERY_DIR  # here: torch only once the stage runs

    model = str(encoder["model"])
    local = Path(model)
    encoder_dir = str(local / QUERY_DIR) if (local / QUERY_DIR).is_dir() else model
    if model in PACKAGED_HUB_IDS:  # pyserini cannot read a packaged model's name: the local folder
        encoder_dir = resolve_model(model)
    sep = load_tokenizer(model).sep_token or "|"
    return {
        "encoder_dir": encoder_dir,
        "tokenizer_name": resolve_model(model) if model in PACKAGED_HUB_IDS else model,
        "hub_id": PACKAGED_HUB_IDS.get(model),
        "pooling": encoder["pooling"],
        "l2_norm": encoder["similarity"] == "cosine",
        "prefix": None,
        "max_length": int(max_query_length),
        "similarity": encoder["similarity"],
        "passage_format": f"{{title}} {sep} {{text}} (text alone when the title is empty)",
    }


def readme(settings: dict) -> str:
    """The folder's README: the exact pyserini call that gives the row's hits."""
    return "\n".join(
        [
            "# A dprflow dense index for pyserini",
            "",
            "`index` is a faiss `IndexFlatIP` of the passage embeddings and `docid` the passage ids "
            "(`<doc_id>#<position>`; a document's score is its best passage's, MaxP, as dprflow scores it). "
            f"Queries must be embedded as dprflow did: {settings['pooling']} pooling"
            + (", L2-normalised (cosine)" if settings["l2_norm"] else ", not normalised (dot product)")
            + f", cut to {settings['max_length']} tokens, no prefix. Passages were embedded as "
            f"`{settings['passage_format']}`. `query_encoder.json` holds these settings.",
            "",
            "```python",
            "from pyserini.search.faiss import AutoQueryEncoder, FaissSearcher",
            "",
            "encoder = AutoQueryEncoder(",
            f"    {settings['encoder_dir']!r},",
            f"    tokenizer_name={settings['tokenizer_name']!r},",
            f"    pooling={settings['pooling']!r},",
            f"    l2_norm={settings['l2_norm']},",
            ")",
            "searcher = FaissSearcher('<this folder>', encoder)",
            f"hits = searcher.search({{'query': query, 'max_length': {settings['max_length']}}}, k=10)",
            "```",
            "",
            "The paths are relative to the folder the workflow ran in"
            + (
                f" (the model is `{settings['hub_id']}` on the Hugging Face hub)."
                if settings["hub_id"]
                else "."
            )
            + " Given only the model path, `AutoQueryEncoder` takes [CLS] pooling without normalisation"
            + (
                ": wrong for this index."
                if settings["pooling"] != "cls" or settings["l2_norm"]
                else ", which is this index's geometry."
            ),
            "",
        ]
    )


def export(args: Args) -> None:
    try:
        encoder = json.loads(Path(args.encoder).read_text())
        settings = query_encoder_settings(encoder, args.max_query_length)
    except (OSError, json.JSONDecodeError, KeyError) as exc:
        raise StageError(
            f"{args.encoder}: expected search_dense's encoder.json with model, pooling, similarity ({exc})"
        ) from exc
    index = FlatIndex.from_files(args.embeddings)
    extra = {SETTINGS_FILE: json.dumps(settings, indent=2) + "\n", "README.md": readme(settings)}
    write_faiss_index(index, args.out, extra)
    log.info(
        "faiss index of %d passages (dimension %d) in %s; queries: %s pooling, l2_norm=%s, max_length %d",
        index.ntotal,
        index.dim,
        args.out,
        settings["pooling"],
        settings["l2_norm"],
        settings["max_length"],
    )


def main(argv: list[str] | None = None) -> int:
    return run_stage(Args, export, argv, "export_faiss")


if __name__ == "__main__":
    sys.exit(main())
