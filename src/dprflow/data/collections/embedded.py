"""The default test collection: docstrings of the installed Python standard library, offline.

Every documented public function, class and method of the standard library becomes one
document, and the summary of its docstring becomes the query that should retrieve it::

    doc_id = title = "json.dumps"                      (the dotted module.Qualname)
    query          = "Serialize ``obj`` to a JSON formatted ``str``."
    text           = "If ``skipkeys`` is true then ``dict`` keys that are not basic types ..."
                     (the rest of the docstring, its summary removed)

The source files are parsed with :mod:`ast` and never imported, so nothing in them runs and
modules that only import on another platform (``winreg`` users, ``msvcrt``) are read as well.

**The collection depends on the Python that builds it.** Two Python versions (even two patch
releases) ship different docstrings, so they give different documents, queries and splits. A
stage should log :func:`stdlib_version` next to the counts; the workflow should treat the
interpreter as an input of the ingest stage.

Rules, in the order they are applied:

1. Files. The stdlib directory (``sysconfig.get_paths()["stdlib"]``) is walked in sorted order.
   Directories in :data:`SKIPPED_DIRECTORIES` (test suites, the IDLE application, the
   deprecated ``lib2to3`` fixers, the turtle demo scripts, installed third-party packages,
   byte-code caches) are skipped, as are directories whose names are not Python identifiers
   (``site-packages``, ``lib-dynload``, ``config-3.11-...``): they cannot be packages. Private
   modules and packages (a name starting with ``_``, including ``__main__``) are skipped like
   any other private name. Files are decoded as UTF-8 (a BOM is allowed); a file that does not
   decode or does not parse is skipped and counted (``files_unparsable``).
2. Objects. ``def``, ``async def`` and ``class`` statements at module level and inside class
   bodies, nested classes included, also when they sit inside ``if``/``try``/``with``/``for``/
   ``while``/``match`` blocks. Definitions local to a function body are not part of any API
   (their qualified name contains ``<locals>``) and are only counted (``objects_local``).
3. Summary and text (:func:`split_summary`). The docstring is cleaned as
   :func:`inspect.cleandoc` does. Leading call-signature lines of old-style docstrings
   (``"dup() -> socket object"``, pdb's ``"w(here)"``) are dropped
   (``summaries_after_signature``). The summary is the first paragraph, cut after its first
   sentence when it holds more than one (PEP 257's "summary line";
   ``summaries_cut_at_sentence``) and before a doctest line (``>>>``); the query is the
   summary on one line. The document text is the rest of the docstring, with trailing spaces
   removed, runs of spaces inside a line collapsed (indentation kept) and runs of blank lines
   collapsed to one (:func:`normalise_text`). Line breaks are kept, so lists and doctest
   examples stay readable.
4. Skips, each counted once under the first reason that applies: no docstring
   (``objects_undocumented``); a private name anywhere in the dotted name, dunder methods
   included (``objects_private``: their summaries are boilerplate such as "Return
   self==value." or "Initialize a handler."); a summary shorter than
   :data:`MIN_SUMMARY_WORDS` words, or none (``objects_short_summary``); a text shorter than
   :data:`MIN_TEXT_WORDS` words (``objects_short_text``, mostly one-line docstrings).
5. Duplicates. A dotted name defined twice (``if``/``else`` branches) keeps its first
   definition, in file order, that passed the skips (``documents_duplicate_id``). This is done
   before step 6, so the twin docstrings of such branches are not taken for ambiguity.
6. Ambiguous summaries. A summary shared by more than one document (compared case-folded, with
   white space collapsed) cannot name one answer: those queries are dropped, their documents
   stay in the corpus (``queries_ambiguous_summary``).
7. Cap. With ``max_documents``, the documents with the smallest ``sha1(doc_id)`` are kept, so a
   smaller cap gives a subset of a larger one and the subset barely moves when the stdlib
   grows; queries and qrels follow their documents (``documents_over_cap``). Ambiguity is
   decided before the cap, so it does not depend on it.
8. Splits. ``query_id = "q" + sha1(doc_id)[:12]``; the split is fixed by
   ``int(sha1(query_id), 16) % 100``: below 80 train, below 90 dev, otherwise test.

Each query has exactly one relevant document (``relevance`` 1). The tables are sorted by their
ids, so the same stdlib always gives identical tables.
"""

from __future__ import annotations

import ast
import hashlib
import logging
import os
import platform
import re
import sysconfig
import textwrap
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from dprflow.data.collections import Collection

log = logging.getLogger(__name__)

# Directory names skipped at any depth, and why:
SKIPPED_DIRECTORIES: frozenset[str] = frozenset(
    {
        "__pycache__",  # byte code
        "site-packages",  # third-party packages, not the stdlib
        "dist-packages",  # Debian's name for site-packages
        "test",  # the regression test suite and the per-package test suites (ctypes, sqlite3, ...)
        "tests",  # distutils.tests, lib2to3.tests
        "idle_test",  # idlelib.idle_test
        "idlelib",  # the IDLE application: internal GUI code, docstrings are notes to its developers
        "lib2to3",  # deprecated 2to3 fixers and grammar driver: terse, internal docstrings
        "turtledemo",  # demo scripts, not an API
    }
)
# tkinter is kept: its docstrings are real (if terse) prose about a public API.

MIN_SUMMARY_WORDS = 3  # a query needs a few words to be a question at all
MIN_TEXT_WORDS = 8  # a document needs a sentence or so beyond its summary
SPLIT_BOUNDS = (("train", 80), ("dev", 90), ("test", 100))  # sha1(query_id) % 100 below bound

# Every key of Collection.counts, always present (0 when nothing happened), described in the module docstring.
COUNT_KEYS = (
    "directories_skipped",
    "files_not_module",  # a .py file whose name is not an identifier, or an __init__.py at the root
    "files_private_module",
    "files_unparsable",
    "modules_parsed",
    "objects_undocumented",
    "objects_local",
    "objects_private",
    "objects_short_summary",
    "objects_short_text",
    "summaries_cut_at_sentence",
    "summaries_after_signature",
    "documents_duplicate_id",
    "queries_ambiguous_summary",
    "documents_over_cap",
    "documents",
    "queries",
    "queries_train",
    "queries_dev",
    "queries_test",
)

_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)

# End of a sentence: ., ! or ? followed by white space and something that can start a sentence.
# Not after "e.g.", "i.e." (letter.letter.) or "etc.", "cf.", "vs.".
_SENTENCE_END = re.compile(r"(?<![A-Za-z]\.[A-Za-z])(?<!\betc)(?<!\bcf)(?<!\bvs)[.!?](?=\s+[A-Z0-9`'\"(\[*])")
_SIGNATURE_LINE = re.compile(r"\s*[A-Za-z_][\w.]*\(")  # "name(" opening a line: a call signature
_DOCTEST_LINE = re.compile(r"^[ \t]*>>>", re.MULTILINE)
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
_INNER_SPACES = re.compile(r"(?<=\S)[ \t]{2,}")


def stdlib_version() -> str:
    """The Python whose standard library :func:`build_embedded` reads by default.

    For example ``"CPython 3.11.7"``. The collection changes with it: log it with the counts.
    """
    return f"{platform.python_implementation()} {platform.python_version()}"


def default_stdlib_dir() -> Path:
    """The standard library directory of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def sha1_hex(text: str) -> str:
    """The SHA-1 of ``text`` (UTF-8) in hex: the key of the cap, the ids and the splits."""
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def query_id_for(doc_id: str) -> str:
    """The stable id of the query whose answer is ``doc_id``: ``"q"`` + 12 hex digits of its SHA-1."""
    return "q" + sha1_hex(doc_id)[:12]


def split_bounds(percent: tuple[int, int, int]) -> tuple[tuple[str, int], ...]:
    """Cumulative bounds of (train, dev, test) percentages, e.g. (80, 10, 10) -> SPLIT_BOUNDS."""
    if len(percent) != 3 or min(percent) < 0 or sum(percent) != 100:
        raise ValueError(f"split percentages must be three numbers >= 0 summing to 100, got {list(percent)}")
    train, dev, _ = percent
    return (("train", train), ("dev", train + dev), ("test", 100))


def split_for(query_id: str, bounds: tuple[tuple[str, int], ...] = SPLIT_BOUNDS) -> str:
    """The split of a query, fixed by its id: by default 80 % train, 10 % dev, 10 % test."""
    bucket = int(sha1_hex(query_id), 16) % 100
    return next(name for name, bound in bounds if bucket < bound)


class SplitDocstring(NamedTuple):
    summary: str  # the query: first sentence of the first paragraph, on one line ("" if none)
    text: str  # the document: everything after the summary, white space tidied
    cut_at_sentence: bool  # the first paragraph held more than one sentence
    signature_lines: int  # leading "name(args) -> result" lines dropped


def split_summary(docstring: str) -> SplitDocstring:
    """Split a cleaned docstring into its summary and the rest.

    Leading call-signature lines of old-style docstrings (``"detach() -> file descriptor"``,
    pdb's ``"w(here)"``) are dropped first. The summary is then the first paragraph on one
    line; when that paragraph holds more than one sentence only its first sentence is the
    summary and the others start the text. A doctest line (``>>>``) ends the first paragraph;
    a docstring that opens with one has no summary.

    >>> split_summary("Return the sum\\nof two numbers.\\n\\nBoth must be numbers.")[:2]
    ('Return the sum of two numbers.', 'Both must be numbers.')
    >>> split_summary("dup() -> socket object\\n\\nDuplicate the socket. Return a new object.")[:2]
    ('Duplicate the socket.', 'Return a new object.')
    """
    lines = docstring.strip().splitlines()
    dropped = depth = 0
    while dropped < len(lines) and (depth > 0 or _SIGNATURE_LINE.match(lines[dropped])):
        depth = max(0, depth + lines[dropped].count("(") - lines[dropped].count(")"))
        dropped += 1
    body = "\n".join(lines[dropped:]).strip()
    brk = _PARAGRAPH_BREAK.search(body)
    first, rest = (body[: brk.start()], body[brk.end() :]) if brk else (body, "")
    example = _DOCTEST_LINE.search(first)
    if example is not None:  # a doctest example starts the text
        rest = f"{first[example.start() :].strip()}\n\n{rest}"
        first = first[: example.start()]
    end = _SENTENCE_END.search(first)
    if end is not None:
        rest = f"{first[end.end() :].strip()}\n\n{rest}"
        first = first[: end.end()]
    return SplitDocstring(" ".join(first.split()), normalise_text(rest), end is not None, dropped)


def normalise_text(text: str) -> str:
    """Tidy white space in a document text and keep its lines.

    Common indentation and trailing spaces are removed, runs of spaces inside a line become one
    space (indentation is kept), runs of blank lines become one blank line.
    """
    lines: list[str] = []
    for line in textwrap.dedent(text).splitlines():
        line = _INNER_SPACES.sub(" ", line.rstrip())
        if line or (lines and lines[-1]):
            lines.append(line)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def word_count(text: str) -> int:
    """Words as :meth:`str.split` sees them (the unit of the skip thresholds)."""
    return len(text.split())


@dataclass(frozen=True)
class _Document:
    doc_id: str
    summary: str
    text: str


def build_embedded(
    max_documents: int | None = None,
    stdlib_dir: str | os.PathLike | None = None,
    split_percent: tuple[int, int, int] = (80, 10, 10),
) -> Collection:
    """Build the standard-library docstring collection (see the module docstring for the rules).

    Args:
        max_documents: keep at most this many documents, those with the smallest
            ``sha1(doc_id)``; ``None`` keeps all.
        stdlib_dir: the directory to read; default :func:`default_stdlib_dir`. Any tree of
            ``.py`` files works (the tests use a small fake one).
        split_percent: shares of the queries in train, dev and test (by ``sha1(query_id)``).

    Returns:
        A :class:`~dprflow.data.collections.Collection`; its ``counts`` hold the skips by reason and
        ``modules_parsed``, ``documents``, ``queries``, ``queries_train``, ``queries_dev``,
        ``queries_test``.
    """
    if max_documents is not None and (isinstance(max_documents, bool) or max_documents < 1):
        raise ValueError(f"max_documents must be a positive integer or None, got {max_documents!r}")
    bounds = split_bounds(tuple(split_percent))
    root = Path(stdlib_dir) if stdlib_dir is not None else default_stdlib_dir()
    if not root.is_dir():
        raise FileNotFoundError(
            f"{root}: no such directory (expected a Python standard library such as {default_stdlib_dir()})"
        )

    counts: Counter[str] = Counter(dict.fromkeys(COUNT_KEYS, 0))
    documents: dict[str, _Document] = {}
    for module, path in _module_files(root, counts):
        tree = _parse(path, counts)
        if tree is None:
            continue
        counts["modules_parsed"] += 1
        for doc in _documents(tree.body, module, counts):
            if doc.doc_id in documents:
                counts["documents_duplicate_id"] += 1
            else:
                documents[doc.doc_id] = doc

    by_summary = Counter(_summary_key(doc.summary) for doc in documents.values())
    answerable = {d for d, doc in documents.items() if by_summary[_summary_key(doc.summary)] == 1}
    counts["queries_ambiguous_summary"] += len(documents) - len(answerable)

    keep = sorted(documents)
    if max_documents is not None and max_documents < len(keep):
        kept = set(sorted(keep, key=sha1_hex)[:max_documents])
        counts["documents_over_cap"] += len(keep) - len(kept)
        keep = [d for d in keep if d in kept]

    doc_rows = [(d, d, documents[d].text) for d in keep]
    query_rows, qrel_rows = [], []
    seen: dict[str, str] = {}
    for doc_id in keep:
        if doc_id not in answerable:
            continue
        qid = query_id_for(doc_id)
        if qid in seen:  # 48 bits: about 1 chance in 5 million at 10,000 documents
            raise RuntimeError(f"query id {qid} is shared by {seen[qid]!r} and {doc_id!r}; lengthen the id")
        seen[qid] = doc_id
        query_rows.append((qid, documents[doc_id].summary, split_for(qid, bounds)))
        qrel_rows.append((qid, doc_id, 1))
    query_rows.sort()
    qrel_rows.sort()

    queries = _frame(query_rows, {"query_id": str, "text": str, "split": str})
    for name, _ in SPLIT_BOUNDS:
        counts[f"queries_{name}"] = int((queries["split"] == name).sum())
    counts["documents"] = len(doc_rows)
    counts["queries"] = len(query_rows)
    return Collection(
        documents=_frame(doc_rows, {"doc_id": str, "title": str, "text": str}),
        queries=queries,
        qrels=_frame(qrel_rows, {"query_id": str, "doc_id": str, "relevance": "int32"}),
        counts={key: int(counts[key]) for key in COUNT_KEYS},
    )


def _frame(rows: list[tuple], dtypes: dict[str, object]) -> pd.DataFrame:
    """A table with fixed column dtypes, also when it has no rows."""
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(dtypes)
    series = {
        name: pd.Series(list(values), dtype=dtype)
        for (name, dtype), values in zip(dtypes.items(), columns, strict=True)
    }
    return pd.DataFrame(series)


def _summary_key(summary: str) -> str:
    return " ".join(summary.casefold().split())


def _module_files(root: Path, counts: Counter[str]) -> Iterator[tuple[str, Path]]:
    """Yield ``(dotted module name, path)`` for the public ``.py`` modules under ``root``, sorted."""
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        package = here.relative_to(root).parts
        kept = []
        for name in sorted(dirnames):
            if name in SKIPPED_DIRECTORIES or not name.isidentifier() or name.startswith("_"):
                counts["directories_skipped"] += 1
            else:
                kept.append(name)
        dirnames[:] = kept
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            stem = name[:-3]
            if not stem.isidentifier():
                counts["files_not_module"] += 1
                continue
            if stem == "__init__":
                parts = package
            elif stem.startswith("_"):
                counts["files_private_module"] += 1
                continue
            else:
                parts = (*package, stem)
            if not parts:  # an __init__.py at the root itself names no module
                counts["files_not_module"] += 1
                continue
            yield ".".join(parts), here / name


def _parse(path: Path, counts: Counter[str]) -> ast.Module | None:
    """Parse one file without importing it; ``None`` (counted) if it does not decode or parse."""
    try:
        source = path.read_bytes().decode("utf-8-sig")
        return ast.parse(source, filename=str(path))
    except (UnicodeDecodeError, SyntaxError, ValueError, RecursionError) as exc:
        counts["files_unparsable"] += 1
        log.debug("%s: skipped, %s: %s", path, type(exc).__name__, exc)
        return None


def _definitions(body: list[ast.stmt], prefix: str, counts: Counter[str]) -> Iterator[tuple[str, ast.AST]]:
    """Yield ``(dotted name, node)`` for the definitions of a module or class body, in file order."""
    for node in body:
        if isinstance(node, _DEFINITIONS):
            name = f"{prefix}.{node.name}"
            yield name, node
            if isinstance(node, ast.ClassDef):
                yield from _definitions(node.body, name, counts)
            else:
                counts["objects_local"] += _count_documented(node.body)
        else:  # if/try/with/for/while/match bodies still belong to the module or class namespace
            for inner in _statement_lists(node):
                yield from _definitions(inner, prefix, counts)


def _statement_lists(node: ast.stmt) -> Iterator[list[ast.stmt]]:
    """The statement lists directly inside a compound statement (definitions can only sit there)."""
    if isinstance(node, ast.Match):
        for case in node.cases:
            yield case.body
    for field in ("body", "orelse", "finalbody"):
        value = getattr(node, field, None)
        if isinstance(value, list):
            yield value
    for handler in getattr(node, "handlers", []):
        yield handler.body


def _count_documented(body: list[ast.stmt]) -> int:
    """Documented definitions at any depth in a function body (statements only, no expressions)."""
    total = 0
    for node in body:
        if isinstance(node, _DEFINITIONS) and ast.get_docstring(node) is not None:
            total += 1
        for inner in _statement_lists(node):
            total += _count_documented(inner)
    return total


def _documents(body: list[ast.stmt], module: str, counts: Counter[str]) -> Iterator[_Document]:
    """Yield the documents of one module, counting the objects skipped by reason."""
    for doc_id, node in _definitions(body, module, counts):
        docstring = ast.get_docstring(node, clean=True)
        if not docstring or not docstring.strip():
            counts["objects_undocumented"] += 1
            continue
        if any(part.startswith("_") for part in doc_id.split(".")):
            counts["objects_private"] += 1
            continue
        split = split_summary(docstring)
        if word_count(split.summary) < MIN_SUMMARY_WORDS:
            counts["objects_short_summary"] += 1
            continue
        if word_count(split.text) < MIN_TEXT_WORDS:
            counts["objects_short_text"] += 1
            continue
        counts["summaries_cut_at_sentence"] += split.cut_at_sentence
        counts["summaries_after_signature"] += split.signature_lines > 0
        yield _Document(doc_id=doc_id, summary=split.summary, text=split.text)
