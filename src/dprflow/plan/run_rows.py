"""The rows one run scores, read from its config: the collections that train, the fine-tuning
seeds, each method's stages, the rows that train nothing (BM25, the model off the shelf, the
reference models), the trained and the fused rows, every (collection, row) scored, transfer
included, and the comparison's rows (seeds folded away).

The rules list their targets from one :class:`RunRows` (rules/common.smk, ``ROWS``); how a row is
named is :mod:`.rows`'s business, which methods have a zeroshot row of their own :mod:`.methods`'.
"""

from __future__ import annotations

from . import rows
from .methods import ZEROSHOT_METHODS


class RunRows:
    """The rows of the run of ``config`` (a validated config: defaults filled in); ``references``:
    the row methods of ``model.references`` (``ref-<name>``, dprflow.config.reference_models)."""

    def __init__(self, config: dict, references: list[str]):
        self.collections = config["collections"]
        self.methods = list(config["methods"])
        self.finetune = config["finetune"]
        self.top_seeds = config["seeds"]
        self.seeds_of = config.get("seeds_of") or {}
        self.references = list(references)

    def training_collections(self) -> list[str]:
        """Collections that train rows (every one not marked evaluate_only)."""
        return [c for c, spec in self.collections.items() if not spec["evaluate_only"]]

    def transfer_targets(self, collection: str) -> list[str]:
        """The other collections the rows trained on ``collection`` are scored on: its
        evaluate_on, then every evaluate-only collection."""
        evaluate_only = [c for c, s in self.collections.items() if s["evaluate_only"]]
        targets = dict.fromkeys(self.collections[collection]["evaluate_on"] + evaluate_only)
        return [c for c in targets if c != collection]

    def seeds(self, method: str | None = None, stage: str | None = None) -> list[int]:
        """The fine-tuning seeds of ``method``'s row ``stage``: seeds_of's for the row
        (``<method>/<stage>``), else for the method, else the run's (the top-level seeds list, else
        finetune.seed alone); without a stage, every seed of any of the method's rows, in order."""
        if method is None:
            return list(self.top_seeds or [self.finetune["seed"]])
        if stage is None:
            return list(dict.fromkeys(seed for s in self.stages(method) for seed in self.seeds(method, s)))
        for key in (f"{method}/{stage}", method):
            if key in self.seeds_of:
                return list(self.seeds_of[key])
        return self.seeds()

    def stages(self, method: str) -> list[str]:
        """The fine-tuned stages of ``method`` (finetune.stages_of, else finetune.stages), in the
        pipeline's order."""
        chosen = self.finetune["stages_of"].get(method, self.finetune["stages"])
        return [stage for stage in rows.STAGES if stage in chosen]

    def untrained(self) -> list[str]:
        """Rows that train nothing on the collection: BM25, the initial model and each reference
        model off the shelf; every collection scores its own."""
        return [rows.BM25, rows.OFF_THE_SHELF] + [rows.zeroshot(r) for r in self.references]

    def seeded_stages(self, method: str) -> list[tuple[int, str]]:
        """(seed, stage) of every fine-tuned row of ``method``, seed by seed in the pipeline's order."""
        stages = self.stages(method)
        return [(seed, s) for seed in self.seeds(method) for s in stages if seed in self.seeds(method, s)]

    def trained(self) -> list[str]:
        """Rows trained on a collection: a method's pre-trained encoder as it is (Contriever) and
        each method's fine-tuned stages once per seed."""
        out = [rows.zeroshot(m) for m in self.methods if m in ZEROSHOT_METHODS]
        for method in self.methods:
            out += [rows.trained(method, seed, s) for seed, s in self.seeded_stages(method)]
        return out

    def fused(self) -> list[str]:
        """The dense rows fused with BM25 (finetune.fusion.rows), ``<row>+bm25``: the model off the
        shelf (and a method's own zeroshot row) and each method's fine-tuned rows named there."""
        chosen = self.finetune["fusion"]["rows"]
        dense = []
        if rows.ZEROSHOT in chosen:
            dense += [rows.zeroshot(m) for m in ["none", *(m for m in self.methods if m in ZEROSHOT_METHODS)]]
        for method in self.methods:
            dense += [rows.trained(method, seed, s) for seed, s in self.seeded_stages(method) if s in chosen]
        return [rows.fused(row) for row in dense]

    def systems(self) -> list[str]:
        """Every row of a training collection, scored on it."""
        return self.untrained() + self.trained() + self.fused()

    def scored(self) -> list[tuple[str, str]]:
        """(folder collection, row) of every evaluated row: each collection's own rows (an
        evaluate-only collection's: the untrained ones), then each training collection's trained
        rows scored on its transfer targets (``<row>/on-<target>``, in the training collection's
        folder)."""
        out = []
        for c, spec in self.collections.items():
            out += [(c, s) for s in (self.untrained() if spec["evaluate_only"] else self.systems())]
        for c in self.training_collections():
            out += [(c, rows.transfer(s, t)) for t in self.transfer_targets(c) for s in self.trained()]
        return out

    def comparison(self) -> list[str]:
        """The rows of the comparison: each row with its seed folded away (``<method>/<stage>``)."""
        names = (rows.split_transfer(s)[0] for _, s in self.scored())
        return list(dict.fromkeys(rows.without_seed(s) for s in names))
