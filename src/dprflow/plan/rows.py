"""A row of the comparison: how it is named, parsed and ordered, in one place.

A row is a run scored on a collection, named by where it lives under ``results/<collection>/``:

- ``bm25``: Lucene's BM25 (the baseline);
- ``<method>/zeroshot``: an encoder as it is: ``none/zeroshot`` the initial model off the shelf,
  ``ref-<name>/zeroshot`` a reference model (``model.references``), ``contriever/zeroshot`` a
  pre-trained encoder that is a retriever as it is;
- ``<method>/seed-<seed>/<stage>``: a fine-tuned stage (``r1``, ``r2``, ``rerank``, ``distill``)
  of one fine-tuning seed; the comparison folds the seeds away (``<method>/<stage>``);
- ``<row>+bm25``: a dense row fused with BM25 (``finetune.fusion``; docs/selection.md);
- ``<row>/on-<collection>``: a row trained here, scored on another collection (transfer), in
  the training collection's folder.

The Snakefile's wildcard patterns (:func:`system_pattern`), the rules that list the rows, the
comparison (dprflow.evaluation.compare) and the report (dprflow.evaluation.report) read these
functions; no other file spells the grammar.
"""

from __future__ import annotations

import re

BM25 = "bm25"
ZEROSHOT = "zeroshot"
# The fine-tuned stages, in the pipeline's order: each is run once per seed.
STAGES = ("r1", "r2", "rerank", "distill")
STAGE_ORDER = (ZEROSHOT, *STAGES)
OFF_THE_SHELF = f"none/{ZEROSHOT}"
FUSED_SUFFIX = "+bm25"
SEED_PREFIX = "seed-"
TRANSFER_PREFIX = "on-"
REFERENCE_PREFIX = "ref-"
# A method's, a collection's or a reference's name.
NAME = "[A-Za-z0-9_-]+"
_TRANSFER = re.compile(f"^(?P<row>.+)/{TRANSFER_PREFIX}(?P<target>{NAME})$")
_SEED = re.compile(f"(?<=/){SEED_PREFIX}[0-9]+/")


def zeroshot(method: str) -> str:
    """``<method>/zeroshot``: the method's encoder as it is."""
    return f"{method}/{ZEROSHOT}"


def seed_folder(seed: int | str) -> str:
    """``seed-<seed>``: the folder of one fine-tuning seed."""
    return f"{SEED_PREFIX}{seed}"


def trained(method: str, seed: int | str, stage: str) -> str:
    """``<method>/seed-<seed>/<stage>``: a fine-tuned stage of one seed."""
    return f"{method}/{seed_folder(seed)}/{stage}"


def fused(row: str) -> str:
    """``<row>+bm25``: a dense row fused with BM25."""
    return row + FUSED_SUFFIX


def transfer_folder(target: str) -> str:
    """``on-<target>``: the folder, beside a row's own files, of its scores on ``target``."""
    return f"{TRANSFER_PREFIX}{target}"


def transfer(row: str, target: str) -> str:
    """``<row>/on-<target>``: a row scored on another collection than its own."""
    return f"{row}/{transfer_folder(target)}"


def split_transfer(name: str) -> tuple[str, str | None]:
    """``none/seed-13/r2/on-cisi`` -> (``none/seed-13/r2``, ``cisi``); a row scored where it was
    trained -> (name, None). Also for a folder below the method (``seed-13/r2/on-cisi``)."""
    match = _TRANSFER.match(name)
    return (match["row"], match["target"]) if match else (name, None)


def is_fused(name: str) -> bool:
    return split_transfer(name)[0].endswith(FUSED_SUFFIX)


def unfused(name: str) -> str:
    """The dense row a fused row fused (``none/seed-13/r2+bm25`` -> ``none/seed-13/r2``)."""
    return name.removesuffix(FUSED_SUFFIX)


def split_seed(name: str) -> tuple[str, int | None]:
    """``none/seed-13/r2`` -> (``none/r2``, 13); a row without a seed -> (name, None)."""
    parts = name.split("/")
    if len(parts) == 3 and parts[1].startswith(SEED_PREFIX) and parts[1][len(SEED_PREFIX) :].isdigit():
        return f"{parts[0]}/{parts[2]}", int(parts[1][len(SEED_PREFIX) :])
    return name, None


def without_seed(name: str) -> str:
    """The row with its seed folded away, transfer suffix and all (``none/seed-13/r2/on-cisi`` ->
    ``none/r2/on-cisi``): a row of the comparison."""
    return _SEED.sub("", name)


def is_dense(name: str) -> bool:
    """A row searched with a bi-encoder (it has an encoder.json): not BM25, not a reranked run,
    not a fused one."""
    row = split_transfer(name)[0]
    return row != BM25 and row.rpartition("/")[2] != "rerank" and not row.endswith(FUSED_SUFFIX)


def sort_key(name: str, methods: list[str]) -> tuple:
    """The table's order: BM25 and the model off the shelf first, then by method (in ``methods``'
    order), stage (the pipeline's order), a fused row after its row."""
    if name in (BM25, OFF_THE_SHELF):
        return (0, 0, 0, name)
    method, _, stage = name.partition("/")
    m = methods.index(method) if method in methods else len(methods)
    plain = unfused(stage)
    s = STAGE_ORDER.index(plain) if plain in STAGE_ORDER else len(STAGE_ORDER)
    return (1, m, s, stage.endswith(FUSED_SUFFIX), name)


def system_pattern() -> str:
    """The regular expression of every row name (a Snakemake wildcard's constraint): ``bm25``,
    ``<method>/zeroshot`` or ``<method>/seed-<seed>/<stage>``, each of the last two fused or not,
    scored on its own collection or another."""
    return (
        f"{BM25}|{NAME}/({ZEROSHOT}|{SEED_PREFIX}[0-9]+/({'|'.join(STAGES)}))"
        f"({re.escape(FUSED_SUFFIX)})?{transfer_pattern()}"
    )


def transfer_pattern() -> str:
    """The optional ``/on-<collection>`` of a row or an encoder scored on another collection."""
    return f"(/{TRANSFER_PREFIX}{NAME})?"
