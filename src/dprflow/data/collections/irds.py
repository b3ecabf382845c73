"""Load a test collection through ir_datasets (https://ir-datasets.com), for users with internet.

An ir_datasets id names one collection's documents and, usually, one split's queries and qrels
(``msmarco-passage/dev/small``, ``beir/scifact/test``), while a :class:`Collection` holds
several splits. So :func:`load_ir_datasets` takes the id whose documents to load and a mapping
from split (``train``, ``dev``, ``test``) to the id whose queries and qrels make that split::

    load_ir_datasets("msmarco-passage",
                     {"train": "msmarco-passage/train", "dev": "msmarco-passage/dev/small"})
    load_ir_datasets("beir/scifact", {"train": "beir/scifact/train", "test": "beir/scifact/test"})
    load_ir_datasets("dpr-w100/natural-questions/train")   # splits inferred: train
    load_ir_datasets("beir/trec-covid")                     # no split in the id: test

Without ``splits`` the one id gives documents, queries and qrels, and its split is the last
segment of the id that is ``train``, ``dev`` or ``test``; an id with none of them (an
evaluation-only collection such as ``beir/trec-covid``) is taken as ``test``.

Fields are mapped generically over the dataset's namedtuple types (:func:`doc_fields`,
:func:`query_text_field`): a document's title is its ``title`` field if the type has one (else
``""``) and its text the ``text`` field, or ``body`` (``msmarco-document``); a query's text is its
``text`` field, else its first string field (``title`` for TREC topics). Qrels use ``relevance``.

The rules of :mod:`dprflow.data.collections.beir` apply (same counts, same tables, empty texts kept,
score <= 0 kept, a query judged in two splits is an error), with two differences because the
data cannot be fixed by the user here: a qrel naming a document or query that the loaded
collection lacks is dropped and counted (``qrels_unknown_doc``, ``qrels_unknown_query``), and a
split whose qrels are all dropped is an error (its id probably belongs to another collection).
Errors name the ir_datasets id and the record number (1-based) in its iterator.
Order: documents and queries in iterator order (queries split by split in ``splits`` order, each
query once), qrels split by split (train, dev, test) in iterator order.
"""

from __future__ import annotations

import difflib
import logging
import typing
from typing import Any

from dprflow.data.collections import Collection, Documents
from dprflow.data.collections.beir import SPLITS, CollectionError, build_collection

log = logging.getLogger(__name__)


def doc_fields(doc_cls: type) -> tuple[str | None, str]:
    """Return (title field or None, text field) of an ir_datasets document namedtuple type."""
    fields = tuple(getattr(doc_cls, "_fields", ()))
    title = "title" if "title" in fields else None
    for name in ("text", "body"):
        if name in fields:
            return title, name
    raise CollectionError(
        f"document type {doc_cls.__name__} has no 'text' or 'body' field (fields: {list(fields)}); "
        "this collection's documents cannot be mapped to title + text: pick another ir_datasets id "
        "or extend dprflow.data.collections.irds.doc_fields"
    )


def query_text_field(query_cls: type) -> str:
    """Return the text field of an ir_datasets query namedtuple type: ``text``, else the first str field."""
    fields = tuple(getattr(query_cls, "_fields", ()))
    if "text" in fields:
        return "text"
    try:
        hints = typing.get_type_hints(query_cls)
    except Exception:  # an unresolvable annotation: look at the raw ones
        hints = getattr(query_cls, "__annotations__", {})
    for name in fields:
        hint = hints.get(name, str)
        if isinstance(hint, typing.ForwardRef):  # a string annotation (PEP 563) left unresolved
            hint = hint.__forward_arg__
        if name != "query_id" and hint in (str, "str"):
            return name
    raise CollectionError(
        f"query type {query_cls.__name__} has no text field (fields: {list(fields)}); pick another "
        "ir_datasets id or extend dprflow.data.collections.irds.query_text_field"
    )


def infer_split(dataset_id: str) -> str:
    """The last segment of ``dataset_id`` that is a split name, else ``test``."""
    found = [s for s in dataset_id.split("/") if s in SPLITS]
    return found[-1] if found else "test"


def _load(ir_datasets: Any, dataset_id: str, role: str) -> Any:
    try:
        return ir_datasets.load(dataset_id)
    except KeyError:
        close = difflib.get_close_matches(dataset_id, list(ir_datasets.registry), n=5, cutoff=0.6)
        hint = f" (close: {', '.join(close)})" if close else ""
        raise CollectionError(
            f"unknown ir_datasets id {dataset_id!r} for {role}{hint}; run `ir_datasets list` or see "
            "https://ir-datasets.com for the ids"
        ) from None


def _text(value: Any, field: str, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise CollectionError(
            f"{where}: field {field!r} is a {type(value).__name__}, not a string; this dataset cannot be "
            "loaded as text: pick another ir_datasets id"
        )
    return value


def load_ir_datasets(
    dataset_id: str, splits: dict[str, str] | None = None, documents: Documents | None = None
) -> Collection:
    """Load documents from ``dataset_id`` and each split's queries and qrels from ``splits``.

    ``documents`` streams ``docs_iter()``: each batch goes to its ``write`` and the collection
    comes back with ``documents=None``; by default they are gathered into ``Collection.documents``.

    ``splits`` maps a split name (train, dev, test) to an ir_datasets id with queries and qrels;
    without it, ``dataset_id`` is the only split (see the module docstring). Downloads happen
    inside ir_datasets, on first use, into ``$IR_DATASETS_HOME`` (default ``~/.ir_datasets``).
    """
    import ir_datasets  # lazy: only users of this source need it

    if splits is None:
        splits = {infer_split(dataset_id): dataset_id}
    if not splits:
        raise CollectionError(
            f"splits for {dataset_id!r} is empty; map at least one of {list(SPLITS)} to an id"
        )
    unknown = [s for s in splits if s not in SPLITS]
    if unknown:
        raise CollectionError(
            f"unknown split name(s) {unknown} for {dataset_id!r}; allowed: {', '.join(SPLITS)}"
        )

    docs_ds = _load(ir_datasets, dataset_id, "documents")
    if not docs_ds.has_docs():
        raise CollectionError(
            f"ir_datasets id {dataset_id!r} has no documents; give the id of the collection itself "
            "(e.g. 'msmarco-passage') as dataset_id"
        )
    title_field, text_field = doc_fields(docs_ds.docs_cls())
    documents = Documents() if documents is None else documents
    doc_index = documents.ids  # a set, not a dict of positions: msmarco-passage has 8.8M ids
    for n, doc in enumerate(docs_ds.docs_iter(), start=1):
        where = f"ir_datasets {dataset_id!r} document {n}"
        did = str(doc.doc_id)
        if did in doc_index:
            raise CollectionError(
                f"{where}: duplicate doc_id {did!r} (seen in an earlier document); the dataset "
                "is inconsistent: pick another ir_datasets id or report it to ir_datasets"
            )
        title = _text(getattr(doc, title_field), title_field, where) if title_field else ""
        documents.add(did, title, _text(getattr(doc, text_field), text_field, where))
    if not len(documents):
        raise CollectionError(f"ir_datasets {dataset_id!r}: no documents were read")
    log.info("ir_datasets %s: %d documents", dataset_id, len(documents))

    query_ids: list[str] = []
    query_texts: list[str] = []
    query_where: dict[str, tuple[str, int, str]] = {}  # id -> (dataset id, record, text)
    query_split: dict[str, str] = {}
    split_source: dict[str, str] = {}
    qrels: dict[str, tuple[list[str], list[str], list[int]]] = {}
    counts = {"qrels_duplicate": 0, "qrels_unknown_doc": 0, "qrels_unknown_query": 0}

    datasets = {split: _load(ir_datasets, sid, f"split {split!r}") for split, sid in splits.items()}
    for split, sid in splits.items():
        ds = datasets[split]
        if not ds.has_queries() or not ds.has_qrels():
            lacks = " and ".join(
                k for k, has in (("queries", ds.has_queries()), ("qrels", ds.has_qrels())) if not has
            )
            raise CollectionError(
                f"ir_datasets id {sid!r} (split {split!r}) has no {lacks}; give a sub-id that has both, "
                f"e.g. {sid}/{split}, as splits={{{split!r}: ...}}"
            )
        field = query_text_field(ds.queries_cls())
        for n, query in enumerate(ds.queries_iter(), start=1):
            qid = str(query.query_id)
            text = _text(getattr(query, field), field, f"ir_datasets {sid!r} query {n}")
            seen = query_where.get(qid)
            if seen is not None:
                if seen[2] != text:
                    raise CollectionError(
                        f"ir_datasets {sid!r} query {n}: query_id {qid!r} has a different text than in "
                        f"{seen[0]!r} query {seen[1]}; these ids do not come from one collection: fix `splits`"
                    )
                continue
            query_where[qid] = (sid, n, text)
            query_ids.append(qid)
            query_texts.append(text)

    for split in SPLITS:
        if split not in splits:
            continue
        sid = splits[split]
        q_col: list[str] = []
        d_col: list[str] = []
        r_col: list[int] = []
        pair_rel: dict[tuple[str, str], tuple[int, int]] = {}
        read = 0
        for n, qrel in enumerate(datasets[split].qrels_iter(), start=1):
            read += 1
            where = f"ir_datasets {sid!r} qrel {n}"
            qid, did = str(qrel.query_id), str(qrel.doc_id)
            if did not in doc_index:
                counts["qrels_unknown_doc"] += 1
                continue
            if qid not in query_where:
                counts["qrels_unknown_query"] += 1
                continue
            rel = int(qrel.relevance)
            seen = pair_rel.get((qid, did))
            if seen is not None:
                if seen[1] != rel:
                    raise CollectionError(
                        f"{where}: query {qid!r} and document {did!r} are judged {rel} here but {seen[1]} "
                        f"at qrel {seen[0]}; the dataset is inconsistent: pick another ir_datasets id"
                    )
                counts["qrels_duplicate"] += 1
                continue
            pair_rel[(qid, did)] = (n, rel)
            if qid not in query_split:
                query_split[qid] = split
                split_source[qid] = where
            elif query_split[qid] != split:
                raise CollectionError(
                    f"{where}: query {qid!r} is judged in split {split!r} but also in {query_split[qid]!r} "
                    f"({split_source[qid]}); a query belongs to one split: map the splits to disjoint ids"
                )
            q_col.append(qid)
            d_col.append(did)
            r_col.append(rel)
        if read and not q_col:
            raise CollectionError(
                f"ir_datasets {sid!r} (split {split!r}): none of its {read} qrels names a known document "
                f"and query of {dataset_id!r}; the split's id belongs to another collection: fix `splits`"
            )
        qrels[split] = (q_col, d_col, r_col)

    if counts["qrels_unknown_doc"] or counts["qrels_unknown_query"]:
        log.warning(
            "ir_datasets %s: dropped %d qrels naming unknown documents and %d naming unknown queries",
            dataset_id,
            counts["qrels_unknown_doc"],
            counts["qrels_unknown_query"],
        )
    return build_collection(documents, query_ids, query_texts, query_split, qrels, counts)


def download_failure(exc: BaseException, dataset_id: str) -> CollectionError | None:
    """A :class:`CollectionError` naming the id and the cache folder when ``exc`` is ir_datasets
    failing to download (no network: every source refused), else None."""
    seen, cause = set(), exc
    network = False
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        module = type(cause).__module__ or ""
        if module.startswith(("requests", "urllib3", "http.client", "socket")) or (
            isinstance(cause, RuntimeError) and cause.args[:1] == ("All download sources failed",)
        ):
            network = True
            break
        cause = cause.__cause__ or cause.__context__
    if not network:
        return None
    import ir_datasets

    home = ir_datasets.util.home_path()
    sources = cause.args[1] if len(cause.args) > 1 and isinstance(cause.args[1], list) else []
    if sources and isinstance(sources[0], tuple) and len(sources[0]) == 2:
        source, error = sources[0]
        what = f"{len(sources)} source(s), the first {getattr(source, 'url', source)}: {type(error).__name__}"
    else:
        what = type(cause).__name__
    return CollectionError(
        f"ir_datasets {dataset_id!r} is not in the local ir_datasets cache ({home / dataset_id.split('/')[0]}) "
        f"and downloading it needs the network, which failed ({what}); run the ingest once where "
        "the network is reachable, or set IR_DATASETS_HOME to a folder that holds the dataset"
    )
