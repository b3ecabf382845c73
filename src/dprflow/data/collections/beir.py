"""Load a test collection stored in BEIR layout.

The layout (https://github.com/beir-cellar/beir)::

    FOLDER/corpus.jsonl        {"_id": ..., "title": ..., "text": ...}   one document a line
    FOLDER/queries.jsonl       {"_id": ..., "text": ..., "metadata": ...} one query a line
    FOLDER/qrels/train.tsv     query-id<TAB>corpus-id<TAB>score           (header line first)
    FOLDER/qrels/dev.tsv       any subset of the three qrels files, at least one
    FOLDER/qrels/test.tsv

:func:`load_beir` streams every file line by line and is strict: any input it cannot read
unambiguously raises :class:`CollectionError`, whose message names the file, the 1-based line
number, and what would fix it. The documents can go on to a table writer batch by batch
(:class:`~dprflow.data.collections.Documents`), so memory holds one batch and the set of document
ids, not the corpus; queries and qrels are small and stay in memory. The rules it applies:

- Ids are strings. A JSON integer ``_id`` (some converters write ``{"_id": 12}``) is accepted and
  stored as its decimal string ``"12"``, so that it matches the qrels, which are text; any other
  type (float, bool, null, list, ...) is an error, and so is an empty ``_id``.
- ``title`` may be missing or null (stored as ``""``); ``text`` is required and must be a string.
  Extra fields (``metadata``) are ignored.
- Empty texts are kept, not dropped: a document whose title and text are both empty (Cranfield's
  docs 471 and 995) stays in ``documents`` and is counted as ``documents_empty``; an empty query
  stays and is counted as ``queries_empty``. Later stages decide what to do with them (passage
  splitting drops empty documents and counts them).
- Blank lines (only whitespace) are skipped; a UTF-8 byte-order mark on the first line is ignored.
- Qrels are graded integers. Judgments with a score <= 0 are kept with their value (they are
  explicit non-relevant judgments) and counted as ``qrels_nonpositive``. A (query, document) pair
  listed twice in one file with the same score is kept once and counted as ``qrels_duplicate``;
  with different scores it is an error. A qrel naming a document or query that the corpus or the
  query file lacks is an error.
- A query's ``split`` is the qrels file that judges it (``train``, ``dev`` or ``test``); a query
  judged in two files is an error naming both lines; a query judged nowhere gets the split
  ``"unjudged"`` and is counted as ``queries_unjudged``.

Order of the returned tables (deterministic): ``documents`` in corpus-file order, ``queries`` in
query-file order, ``qrels`` split by split (train, dev, test), each in its file's line order.
``relevance`` is stored as int32 (the ``qrels`` schema).

``counts`` holds: ``documents``, ``documents_empty``, ``queries``, ``queries_empty``,
``queries_unjudged``, ``queries_<split>`` for each split present, ``queries_without_relevant``
(judged queries whose judgments are all <= 0), ``qrels``, ``qrels_nonpositive``,
``qrels_duplicate``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from dprflow.data.collections import Collection, Documents

SPLITS = ("train", "dev", "test")
UNJUDGED = "unjudged"
QRELS_HEADER = ("query-id", "corpus-id", "score")
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1
_INT = re.compile(r"\s*[+-]?[0-9]+\s*")


class CollectionError(ValueError):
    """A collection's input cannot be read; the message names the file and line and how to fix it."""


# --------------------------------------------------------------------------------------------------
# Assembly shared with the ir_datasets loader


def build_collection(
    documents: Documents,
    query_ids: list[str],
    query_texts: list[str],
    query_split: dict[str, str],
    qrels: dict[str, tuple[list[str], list[str], list[int]]],
    counts: dict[str, int] | None = None,
) -> Collection:
    """Make the three tables and the counts from checked columns.

    ``query_split`` maps each judged query to its split; ``qrels`` maps each split (in
    :data:`SPLITS` order) to its (query_id, doc_id, relevance) columns. The caller has already
    checked ids, duplicates and that every qrel names a known document and query.
    ``documents`` were added in read order; the collection holds them unless they were written.
    """
    counts = dict(counts or {})
    splits = [query_split.get(q, UNJUDGED) for q in query_ids]
    queries = pd.DataFrame({"query_id": query_ids, "text": query_texts, "split": splits})
    q_cols: list[str] = []
    d_cols: list[str] = []
    r_cols: list[int] = []
    for split in SPLITS:
        if split in qrels:
            q, d, r = qrels[split]
            q_cols.extend(q)
            d_cols.extend(d)
            r_cols.extend(r)
    qrels_df = pd.DataFrame(
        {"query_id": q_cols, "doc_id": d_cols, "relevance": np.asarray(r_cols, dtype=np.int32)},
        columns=["query_id", "doc_id", "relevance"],
    )

    counts["documents"] = len(documents)
    counts["documents_empty"] = documents.empty
    counts["queries"] = len(queries)
    counts["queries_empty"] = sum(1 for x in query_texts if not x.strip())
    counts["queries_unjudged"] = sum(1 for s in splits if s == UNJUDGED)
    for split in SPLITS:
        if split in qrels:
            counts[f"queries_{split}"] = sum(1 for s in splits if s == split)
    relevant = {q for q, r in zip(q_cols, r_cols, strict=True) if r > 0}
    counts["queries_without_relevant"] = sum(1 for q in query_split if q not in relevant)
    counts["qrels"] = len(qrels_df)
    counts["qrels_nonpositive"] = sum(1 for r in r_cols if r <= 0)
    counts.setdefault("qrels_duplicate", 0)
    return Collection(documents=documents.table(), queries=queries, qrels=qrels_df, counts=counts)


# --------------------------------------------------------------------------------------------------
# BEIR files


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield (1-based line number, decoded line without its line ending), skipping blank lines."""
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CollectionError(
                    f"{path}:{lineno}: invalid UTF-8 at byte {exc.start} of the line ({exc.reason}); "
                    "re-encode the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"
                ) from None
            if lineno == 1 and line.startswith("\ufeff"):
                line = line[1:]
            line = line.rstrip("\r\n")
            if line.strip():
                yield lineno, line


def _id(value: object, path: Path, lineno: int) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise CollectionError(
            f"{path}:{lineno}: '_id' must be a string, got {type(value).__name__} {value!r}; "
            'write it as a JSON string, e.g. "_id": "12"'
        )
    value = str(value)
    if not value:
        raise CollectionError(f"{path}:{lineno}: '_id' is empty; give every record a non-empty unique '_id'")
    return value


def _records(path: Path, kind: str) -> Iterator[tuple[int, str, str, str]]:
    """Yield (line, id, title, text) from a BEIR JSON-lines file (title is "" for queries)."""
    for lineno, line in _lines(path):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CollectionError(
                f"{path}:{lineno}: malformed JSON ({exc.msg} at column {exc.colno}); "
                f'each line must be one JSON object such as {{"_id": "1", "text": "..."}}'
            ) from None
        if not isinstance(obj, dict):
            raise CollectionError(
                f"{path}:{lineno}: expected a JSON object, got a JSON {type(obj).__name__}; "
                "write one object with '_id' and 'text' per line"
            )
        for key in ("_id", "text"):
            if key not in obj:
                raise CollectionError(
                    f"{path}:{lineno}: {kind} lacks the field {key!r} (has {sorted(obj)}); "
                    f"every {kind} needs '_id' and 'text'"
                )
        rid = _id(obj["_id"], path, lineno)
        text = obj["text"]
        if not isinstance(text, str):
            raise CollectionError(
                f"{path}:{lineno}: 'text' of {kind} {rid!r} must be a string, got {type(text).__name__}; "
                'write it as a JSON string (use "" for an empty text)'
            )
        title = ""
        if kind == "document":
            title = obj.get("title")
            if title is None:
                title = ""
            elif not isinstance(title, str):
                raise CollectionError(
                    f"{path}:{lineno}: 'title' of document {rid!r} must be a string, got "
                    f"{type(title).__name__}; write it as a JSON string or leave it out"
                )
        yield lineno, rid, title, text


def _first_line(path: Path, rid: str) -> int:
    """The line of the first record of ``path`` whose id is ``rid`` (a duplicate's message)."""
    kind = "document" if path.name == "corpus.jsonl" else "query"
    return next(lineno for lineno, other, _, _ in _records(path, kind) if other == rid)


def _read_qrels(
    path: Path, doc_ids: set[str], query_line: dict[str, int], corpus: Path, queries: Path
) -> tuple[list[str], list[str], list[int], dict[str, int], int]:
    """Read one qrels file; return its columns, {query_id: first line}, and the duplicate count."""
    q_col: list[str] = []
    d_col: list[str] = []
    r_col: list[int] = []
    first_line: dict[str, int] = {}
    pair_line: dict[tuple[str, str], tuple[int, int]] = {}
    duplicates = 0
    header_seen = False
    for lineno, line in _lines(path):
        cols = line.split("\t")
        if not header_seen:
            header_seen = True
            if tuple(c.strip() for c in cols) == QRELS_HEADER:
                continue
            looks_like_data = len(cols) == 3 and _INT.fullmatch(cols[2]) is not None
            what = "the header line is missing" if looks_like_data else f"unexpected header {line!r}"
            raise CollectionError(
                f"{path}:{lineno}: {what}; the first line of a BEIR qrels file must be "
                "'query-id<TAB>corpus-id<TAB>score'"
            )
        if len(cols) != 3:
            raise CollectionError(
                f"{path}:{lineno}: expected 3 tab-separated columns (query-id, corpus-id, score), got "
                f"{len(cols)}; separate the columns with single tabs"
            )
        qid, did, raw_score = cols
        if not _INT.fullmatch(raw_score):
            raise CollectionError(
                f"{path}:{lineno}: score {raw_score!r} is not an integer; BEIR qrels hold integer grades "
                "(e.g. 0, 1, 2)"
            )
        score = int(raw_score)
        if not _I32_MIN <= score <= _I32_MAX:
            raise CollectionError(
                f"{path}:{lineno}: score {score} does not fit in 32 bits; use a small integer grade"
            )
        if did not in doc_ids:
            raise CollectionError(
                f"{path}:{lineno}: corpus-id {did!r} is not in {corpus.name}; add the document to "
                f"{corpus} or remove this judgment"
            )
        if qid not in query_line:
            raise CollectionError(
                f"{path}:{lineno}: query-id {qid!r} is not in {queries.name}; add the query to "
                f"{queries} or remove this judgment"
            )
        seen = pair_line.get((qid, did))
        if seen is not None:
            earlier, earlier_score = seen
            if earlier_score != score:
                raise CollectionError(
                    f"{path}:{lineno}: query {qid!r} and document {did!r} are judged {score} here but "
                    f"{earlier_score} at {path}:{earlier}; keep one of the two lines"
                )
            duplicates += 1
            continue
        pair_line[(qid, did)] = (lineno, score)
        first_line.setdefault(qid, lineno)
        q_col.append(qid)
        d_col.append(did)
        r_col.append(score)
    if not header_seen:
        raise CollectionError(
            f"{path}: the file is empty; it needs at least the header line 'query-id<TAB>corpus-id<TAB>score'"
        )
    return q_col, d_col, r_col, first_line, duplicates


def load_beir(folder: str | os.PathLike, documents: Documents | None = None) -> Collection:
    """Load a BEIR-layout folder into a :class:`Collection` (rules in the module docstring).

    ``documents`` streams corpus.jsonl: each batch goes to its ``write`` and the collection comes
    back with ``documents=None``; by default they are gathered into ``Collection.documents``.
    Raises :class:`CollectionError` naming the file and line of the first bad input.
    """
    folder = Path(folder)
    corpus = folder / "corpus.jsonl"
    queries_path = folder / "queries.jsonl"
    qrels_dir = folder / "qrels"
    if not folder.is_dir():
        raise CollectionError(f"{folder}: no such folder; give the path of a folder in BEIR layout")
    for path in (corpus, queries_path):
        if not path.is_file():
            raise CollectionError(
                f"{path}: missing; a BEIR folder holds corpus.jsonl, queries.jsonl and qrels/{{train,dev,test}}.tsv"
            )
    qrels_paths = {s: qrels_dir / f"{s}.tsv" for s in SPLITS if (qrels_dir / f"{s}.tsv").is_file()}
    if not qrels_paths:
        found = sorted(p.name for p in qrels_dir.glob("*")) if qrels_dir.is_dir() else []
        raise CollectionError(
            f"{qrels_dir}: no qrels file; expected at least one of train.tsv, dev.tsv, test.tsv "
            f"(found {found or 'nothing'}); rename the judgment file(s) accordingly"
        )

    documents = Documents() if documents is None else documents
    # Streamed: one batch and the ids in memory; a duplicate's first line is found again by
    # reading the file up to it (a line number per id would cost 8.8M int objects).
    for lineno, did, title, text in _records(corpus, "document"):
        if did in documents.ids:
            raise CollectionError(
                f"{corpus}:{lineno}: duplicate _id {did!r}, first at line {_first_line(corpus, did)}; "
                "give every document a unique _id (or drop the repeated line)"
            )
        documents.add(did, title, text)
    if not len(documents):
        raise CollectionError(f"{corpus}: no documents; the corpus needs at least one line")

    query_ids: list[str] = []
    query_texts: list[str] = []
    query_line: dict[str, int] = {}
    for lineno, qid, _, text in _records(queries_path, "query"):
        if qid in query_line:
            raise CollectionError(
                f"{queries_path}:{lineno}: duplicate _id {qid!r}, first at line {query_line[qid]}; "
                "give every query a unique _id (or drop the repeated line)"
            )
        query_line[qid] = lineno
        query_ids.append(qid)
        query_texts.append(text)
    if not query_ids:
        raise CollectionError(f"{queries_path}: no queries; the file needs at least one line")

    query_split: dict[str, str] = {}
    where: dict[str, str] = {}
    qrels: dict[str, tuple[list[str], list[str], list[int]]] = {}
    duplicates = 0
    for split, path in qrels_paths.items():
        q_col, d_col, r_col, first_line, dups = _read_qrels(
            path, documents.ids, query_line, corpus, queries_path
        )
        duplicates += dups
        for qid, lineno in first_line.items():
            if qid in query_split:
                raise CollectionError(
                    f"{path}:{lineno}: query {qid!r} is judged in split {split!r} but also in "
                    f"{query_split[qid]!r} at {where[qid]}; a query belongs to one split, so keep its "
                    "judgments in one qrels file"
                )
            query_split[qid] = split
            where[qid] = f"{path}:{lineno}"
        qrels[split] = (q_col, d_col, r_col)

    return build_collection(
        documents, query_ids, query_texts, query_split, qrels, {"qrels_duplicate": duplicates}
    )
