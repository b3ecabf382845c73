"""The selection's plan (finetune.select, finetune.fusion; docs/selection.md): which grid points
train, what each job of the selection and of a fused row reads, and their flags.

The rules hold one :class:`SelectionPlan` (rules/common.smk, ``SELECTION``) and name its methods
as input and params functions; each takes the job's wildcards. The choosing itself (scores, the
best point, the fusion) is dprflow.finetuning.selection's.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from dprflow.plan import UnderResults, rows
from dprflow.plan.run_rows import RunRows
from dprflow.rule_flags import q

# The folders, in a seed's select/, of the reranker grid's points (select/rerank/<point>), the
# negatives' grid's (retriever 2 trained on the fit part: select/r2/<point>) and the
# distillation's (select/distill/<point>), with their choices.
RERANKER_GRID = "rerank"
NEGATIVES_GRID = "r2"
DISTILL_GRID = "distill"


def selection_flags(files: list[str]) -> str:
    """``--selection`` naming ``files`` (the paths rebuilt from the wildcards, not read from input:
    see the note at the top of rules/common.smk), or nothing when no grid chose."""
    return f" --selection {' '.join(q(f) for f in files)}" if files else ""


class SelectionPlan(UnderResults):
    """``grids``: each finetune.select grid's points by folder name, in grid order
    (dprflow.finetuning.selection.grid_points and point_name): ``retriever`` (an empty grid is one
    point, ``{}``, the settings as configured), ``reranker`` (the same where only the
    distillation's grid needs a teacher trained on the fit part, else none when empty),
    ``negatives`` (retriever 2's mix) and ``distill``; a grid left out has no point."""

    def __init__(
        self, config: dict, results: str, run_rows: RunRows, grids: dict[str, dict[str, dict[str, Any]]]
    ):
        self.finetune = config["finetune"]
        self.select = self.finetune["select"]
        self.fusion = self.finetune["fusion"]
        self.methods = list(config["methods"])
        self.results = results
        self.points = grids["retriever"]
        self.reranker_points = grids.get("reranker", {})
        self.negatives_points = grids.get("negatives", {})
        self.distill_points = grids.get("distill", {})
        self.rows = run_rows
        self.heldout_queries = f"{results}/{{collection}}/collection/heldout_queries.parquet"

    def selects_settings(self) -> bool:
        """Whether r1 and r2 train with settings chosen on held-out queries (a grid with a choice)."""
        return bool(self.select["retriever"])

    def seed_path(self, wildcards, *parts: str) -> str:
        """A path in the folder of the job's method and seed."""
        return self.path(wildcards.collection, wildcards.method, rows.seed_folder(wildcards.seed), *parts)

    def choosing_method(self, method: str) -> str:
        """The method whose grids choose ``method``'s settings: its own, or finetune.select.by's
        (one recipe for every method, chosen on that method's held-out scores)."""
        return self.select["by"] or method

    def choosing_seed(self, method: str, seed: int | str) -> int | str:
        """The seed whose grids choose a seed's settings: its own, or with
        finetune.select.per_seed false the choosing method's first (every seed then trains with
        one choice)."""
        return seed if self.select["per_seed"] else self.rows.seeds(self.choosing_method(method))[0]

    def chosen_file(self, wildcards, *parts: str) -> str:
        """A choice a row of the job's method and seed reads, in the select/ folder of its choosing
        method and seed."""
        seed = rows.seed_folder(self.choosing_seed(wildcards.method, wildcards.seed))
        method = self.choosing_method(wildcards.method)
        return self.path(wildcards.collection, method, seed, "select", *parts)

    def selection_file(self, wildcards) -> list[str]:
        """The selection.json files a retriever reads, where grids choose: r1, r2 and the
        negatives' points the retriever grid's; r2 also the negatives' mix's; the distilled row
        the distillation's."""
        files = []
        if self.selects_settings() and (
            wildcards.trained in ("r1", "r2") or self.is_negatives_point(wildcards)
        ):
            files.append(self.chosen_file(wildcards, "selection.json"))
        if wildcards.trained == "r2" and self.selects_negatives(wildcards.method):
            files.append(self.chosen_file(wildcards, NEGATIVES_GRID, "selection.json"))
        if wildcards.trained == "distill" and self.selects_distill(wildcards.method):
            files.append(self.chosen_file(wildcards, DISTILL_GRID, "selection.json"))
        return files

    def selection_flag(self, wildcards) -> str:
        """--selection of a retriever whose settings grids chose."""
        return selection_flags(self.selection_file(wildcards))

    @staticmethod
    def on_fit(folder: str) -> bool:
        """Whether a job's folder in its seed's (``trained``, ``reranker``, ``scorer``) is the
        selection's, under ``select/``: it trains or labels on the fit part."""
        return folder.startswith("select/")

    @staticmethod
    def is_point(wildcards) -> bool:
        """Whether the retriever trained is a point of the retriever's grid (``select/<point>``)."""
        return wildcards.trained.startswith("select/") and wildcards.trained.count("/") == 1

    @staticmethod
    def is_negatives_point(wildcards) -> bool:
        """Whether the retriever trained is a point of the negatives' grid (``select/r2/<point>``)."""
        return wildcards.trained.startswith(f"select/{NEGATIVES_GRID}/")

    @staticmethod
    def is_distill_point(wildcards) -> bool:
        """Whether the retriever trained is a point of the distillation's grid (``select/distill/<point>``)."""
        return wildcards.trained.startswith(f"select/{DISTILL_GRID}/")

    def trains(self, method: str, stage: str) -> bool:
        """Whether ``method`` trains ``stage``, as a row or for a later row (r2 feeds the reranker,
        the reranker the distilled retriever)."""
        later = {"r2": ("r2", "rerank", "distill"), "rerank": ("rerank", "distill"), "distill": ("distill",)}[
            stage
        ]
        return any(s in later for s in self.rows.stages(method))

    def selects_negatives(self, method: str) -> bool:
        """Whether ``method``'s retriever 2 draws its negatives' mix as chosen on held-out queries."""
        return bool(self.negatives_points) and self.trains(method, "r2")

    def selects_distill(self, method: str) -> bool:
        """Whether ``method``'s distilled retriever trains with settings chosen on held-out queries."""
        return bool(self.distill_points) and self.trains(method, "distill")

    @staticmethod
    def named_point(points: dict[str, dict[str, Any]], name: str, section: str) -> dict[str, Any]:
        """The settings of the point a folder names, in ``section``'s grid ``points``."""
        if name not in points:
            raise ValueError(
                f"{name!r} is not a point of finetune.select.{section}'s grid: {', '.join(points)}"
            )
        return points[name]

    def point_settings(self, wildcards) -> dict[str, Any]:
        """The settings a grid point trains with (its folder name: ``points``)."""
        return self.named_point(self.points, wildcards.trained.split("/", 1)[1], "retriever")

    def negatives_point_settings(self, wildcards) -> dict[str, Any]:
        """The negatives' mix a negatives' grid point trains with; any other retriever: none."""
        if not self.is_negatives_point(wildcards):
            return {}
        return self.named_point(self.negatives_points, wildcards.trained.rsplit("/", 1)[1], "negatives")

    def distill_point_settings(self, wildcards) -> dict[str, Any]:
        """The settings a distillation grid point trains with; any other retriever: none."""
        if not self.is_distill_point(wildcards):
            return {}
        return self.named_point(self.distill_points, wildcards.trained.rsplit("/", 1)[1], "distill")

    def trains_on_fit(self, wildcards) -> bool:
        """Whether the retriever trained is a point of any grid (retriever, negatives, distillation)."""
        return self.on_fit(wildcards.trained)

    def training_queries(self, wildcards) -> str:
        """The queries a retriever trains on: a grid point reads the held-out split's table (its
        fit part), so that it can never read a test or a held-out query."""
        if self.trains_on_fit(wildcards):
            return self.heldout_queries.format(collection=wildcards.collection)
        return self.path(wildcards.collection, "collection", "queries.parquet")

    # ---- the negatives' grid (select/r2/<point>) -----------------------------------------------

    def fit_negatives(self, wildcards) -> str:
        """The fit queries' pool a negatives' grid point draws from: mined (K2) from the fit
        queries' run of the retriever-1 point chosen on held-out queries."""
        return self.seed_path(wildcards, "select", "negatives.parquet")

    def mined_runs(self, wildcards) -> list[str]:
        """The run a pool is mined from: a row's training-query run, or, for the fit part's pool,
        every retriever point's fit run (mine_negatives takes the chosen one's)."""
        if wildcards.trained == "select":
            return [self.seed_path(wildcards, "select", p, "fit", "run.parquet") for p in self.points]
        return [self.seed_path(wildcards, wildcards.trained, "train_run.parquet")]

    def part_depth(self, wildcards) -> int:
        """The depth of a search of the held-out split's part: the held-out queries' as every
        evaluation run's, the fit queries' as retriever 1's pools (K2)."""
        return self.finetune["search_depth" if wildcards.part == "heldout" else "mining_depth"]

    def mining_selection(self, wildcards) -> list[str]:
        """The selection.json naming whose fit run the fit part's pool is mined from, when the
        retriever's grid chose among several."""
        if wildcards.trained == "select" and self.selects_settings():
            return [self.seed_path(wildcards, "select", "selection.json")]
        return []

    def mining_flags(self, wildcards) -> str:
        """--selection of the fit part's pool."""
        return selection_flags(self.mining_selection(wildcards))

    # ---- the reranker's grid (select/rerank/<point>) -----------------------------------------

    def selects_reranker(self, method: str) -> bool:
        """Whether ``method``'s reranker trains with settings chosen on held-out queries: a
        reranker grid, and a reranker among the method's stages (distill trains one too)."""
        return bool(self.select["reranker"]) and self.trains(method, "rerank")

    def teacher_inputs(self, wildcards) -> dict[str, Any]:
        """What a reranker labels candidates with (``scorer``): the row's model, retriever 2's
        pool (K3) of the training queries; on the fit part (``select/rerank``), the chosen
        reranker point's model (every point's, with the choice), the fit part's pool and queries."""
        if wildcards.scorer == RERANKER_GRID:
            return {
                "model": [self.seed_path(wildcards, RERANKER_GRID, "model")],
                "negatives": self.seed_path(wildcards, "r2", "negatives.parquet"),
                "queries": self.path(wildcards.collection, "collection", "queries.parquet"),
            }
        out = {
            "model": [
                self.seed_path(wildcards, "select", RERANKER_GRID, p, "model") for p in self.reranker_points
            ],
            "negatives": self.fit_negatives(wildcards),
            "queries": self.heldout_queries.format(collection=wildcards.collection),
        }
        if self.select["reranker"]:
            out["selection"] = self.reranker_selection(wildcards)
        return out

    def teacher_flags(self, wildcards) -> str:
        """--selection of the fit part's teacher when the reranker's grid chose among several."""
        return selection_flags(list(filter(None, [self.teacher_inputs(wildcards).get("selection")])))

    def fit_teacher(self, wildcards) -> str:
        """The fit part's candidates labelled by the chosen reranker point: a distillation point's teacher."""
        return self.seed_path(wildcards, "select", RERANKER_GRID, "teacher_scores.parquet")

    @staticmethod
    def is_reranker_point(wildcards) -> bool:
        """Whether the reranker trained is a grid point (``select/rerank/<point>``)."""
        return wildcards.reranker.startswith(f"select/{RERANKER_GRID}/")

    def reranker_point_settings(self, wildcards) -> dict[str, Any]:
        """The settings a reranker grid point trains with; the row's own: none."""
        if not self.is_reranker_point(wildcards):
            return {}
        return self.named_point(self.reranker_points, wildcards.reranker.rsplit("/", 1)[1], "reranker")

    def reranker_selection(self, wildcards) -> str:
        return self.chosen_file(wildcards, RERANKER_GRID, "selection.json")

    def reranker_training(self, wildcards) -> dict[str, str]:
        """What a reranker trains on. A grid point: the fit part of the training queries (the
        split's table, which holds no held-out or test query in that part) with BM25's negatives,
        the one pool no model trained on a held-out query mined. The row: every training query
        with retriever 2's negatives (K3), and the grid's choice when there is one."""
        c = wildcards.collection
        if self.is_reranker_point(wildcards):
            return {
                "queries": self.heldout_queries.format(collection=c),
                "negatives": self.path(c, rows.BM25, "negatives.parquet"),
            }
        out = {
            "queries": self.path(c, "collection", "queries.parquet"),
            "negatives": self.seed_path(wildcards, "r2", "negatives.parquet"),
        }
        if self.selects_reranker(wildcards.method):
            out["selection"] = self.reranker_selection(wildcards)
        return out

    def reranker_selection_flag(self, wildcards) -> str:
        """--selection of the reranker row when a grid chooses its settings."""
        return selection_flags(list(filter(None, [self.reranker_training(wildcards).get("selection")])))

    def reranked_inputs(self, wildcards) -> dict[str, str]:
        """What a reranking reads: a grid point's model reranks BM25's run of the held-out queries;
        the row's, retriever 2's run of the evaluation queries."""
        c, folder = wildcards.collection, wildcards.reranked
        seed = self.seed_path(wildcards)
        if folder == RERANKER_GRID:
            return {
                "model": f"{seed}/{RERANKER_GRID}/model",
                "run": f"{seed}/r2/run.parquet",
                "queries": self.path(c, "collection", "queries.parquet"),
            }
        return {
            "model": f"{seed}/{folder.removesuffix('/heldout')}/model",
            "run": self.path(c, rows.BM25, "heldout", "run.parquet"),
            "queries": self.heldout_queries.format(collection=c),
        }

    # ---- choosing -----------------------------------------------------------------------------

    def bm25_heldout_metrics(self, collection: str) -> str:
        """BM25's scores of the held-out queries: what the reranker's points reranked, alone."""
        return self.path(collection, rows.BM25, "heldout", "metrics.parquet")

    def grid_of(self, wildcards) -> tuple[str, dict[str, dict[str, Any]]]:
        """The section and the points a chooser (``seed-<seed>/select``, or its ``/rerank``)
        chooses among."""
        if wildcards.chooser.endswith(f"/{RERANKER_GRID}"):
            return "reranker", self.reranker_points
        if wildcards.chooser.endswith(f"/{NEGATIVES_GRID}"):
            return "negatives", self.negatives_points
        if wildcards.chooser.endswith(f"/{DISTILL_GRID}"):
            return "distill", self.distill_points
        return "retriever", self.points

    def chooser_inputs(self, wildcards) -> dict[str, Any]:
        """What a seed's selection.json is chosen from: every grid point's held-out metrics (and,
        for the reranker's grid, those of the run its points rerank: BM25's)."""
        c, m = wildcards.collection, wildcards.method
        section, points = self.grid_of(wildcards)
        runs = [self.path(c, m, wildcards.chooser, p, "heldout") for p in points]
        out = {"metrics": [f"{r}/metrics.parquet" for r in runs]}
        if section == "reranker":
            out["first_stage"] = self.bm25_heldout_metrics(c)
        return out

    def chooser_flags(self, wildcards) -> str:
        """The grid, in the order of the metrics files, and the metric the choice maximises."""
        section, points = self.grid_of(wildcards)
        flags = f"--grid {q(json.dumps(list(points.values())))} --metric {q(self.select['metric'])}"
        if section == "reranker":
            flags += f" --section reranker --first-stage {q(self.bm25_heldout_metrics(wildcards.collection))}"
        elif section != "retriever":
            flags += f" --section {q(section)}"
        return flags

    def fusion_runs(self, wildcards) -> list[str]:
        """The dense held-out runs a fusion weight is chosen with: the model off the shelf's, or
        every grid point's (select_fusion takes the chosen point's from selection.json)."""
        c, m = wildcards.collection, wildcards.method
        if wildcards.chooser == rows.ZEROSHOT:
            return [self.path(c, m, rows.ZEROSHOT, "heldout", "run.parquet")]
        return [self.path(c, m, wildcards.chooser, p, "heldout", "run.parquet") for p in self.points]

    def chose_point(self, wildcards) -> bool:
        """Whether a fusion's dense run is the point a grid chose (a seed's, with a grid)."""
        return wildcards.chooser != rows.ZEROSHOT and self.selects_settings()

    def fusion_chooser_inputs(self, wildcards) -> dict[str, Any]:
        """What a fusion.json is chosen from: the dense held-out runs, the grid's choice among
        them, BM25's held-out run, the held-out queries, their judgements and the passages."""
        c = wildcards.collection
        runs = self.fusion_runs(wildcards)
        out = {
            "runs": runs,
            # each run's similarity: the theoretical normalisation's bound
            "encoders": [str(Path(r).with_name("encoder.json")) for r in runs],
            "bm25": self.path(c, rows.BM25, "heldout", "run.parquet"),
            "queries": self.heldout_queries.format(collection=c),
            "qrels": self.path(c, "collection", "qrels.parquet"),
            "passages": self.path(c, "passages.parquet"),
        }
        if self.chose_point(wildcards):
            out["selection"] = self.path(c, wildcards.method, wildcards.chooser, "selection.json")
        return out

    def fusion_chooser_flags(self, wildcards) -> str:
        """Every input but the runs (their paths rebuilt from the wildcards), the weights to try
        and the metric the choice maximises."""
        c = wildcards.collection
        flags = (
            f"--bm25-run {q(self.path(c, rows.BM25, 'heldout', 'run.parquet'))}"
            f" --queries {q(self.heldout_queries.format(collection=c))}"
            f" --qrels {q(self.path(c, 'collection', 'qrels.parquet'))}"
            f" --passages {q(self.path(c, 'passages.parquet'))}"
            f" --metric {q(self.select['metric'])}"
            f" --method convex --weights {' '.join(q(w) for w in self.fusion['weights'])}"
            f" --normalizations {' '.join(q(n) for n in self.fusion['normalizations'])}"
            f" --rrf-k {q(self.fusion['rrf_k'])} --depth {q(self.finetune['search_depth'])}"
        )
        if self.chose_point(wildcards):
            flags += f" --selection {q(self.path(c, wildcards.method, wildcards.chooser, 'selection.json'))}"
        return flags

    def fusion_file(self, wildcards) -> str:
        """Where a fused row's weight was chosen: with the model off the shelf's held-out run for
        a zeroshot row, else with retriever 1 of the chosen grid point trained on the fit part
        (the choosing method's and seed's, as the row's settings)."""
        if wildcards.fused == rows.ZEROSHOT:
            return self.path(wildcards.collection, wildcards.method, rows.ZEROSHOT, "fusion.json")
        seed = wildcards.fused.split("/")[0].removeprefix(rows.SEED_PREFIX)
        row = SimpleNamespace(collection=wildcards.collection, method=wildcards.method, seed=seed)
        return self.chosen_file(row, "fusion.json")

    def fused_inputs(self, wildcards) -> dict[str, str]:
        """The dense run, BM25's run of the same queries and, for the convex combination, the
        fusion.json holding the weight chosen on held-out queries and the dense run's
        encoder.json (its similarity: the theoretical normalisation's bound)."""
        c = wildcards.collection
        out = {
            "dense": self.path(c, wildcards.method, wildcards.fused, "run.parquet"),
            "bm25": self.path(c, rows.BM25, "run.parquet"),
        }
        if self.fusion["method"] == "convex":
            out["fusion"] = self.fusion_file(wildcards)
            out["encoder"] = self.path(c, wildcards.method, wildcards.fused, "encoder.json")
        return out

    def fuse_flags(self, wildcards) -> str:
        flags = (
            f"--method {q(self.fusion['method'])} --rrf-k {q(self.fusion['rrf_k'])}"
            f" --depth {q(self.finetune['search_depth'])}"
        )
        if self.fusion["method"] == "convex":
            flags += f" --fusion {q(self.fusion_file(wildcards))}"
        return flags

    @staticmethod
    def fused_tag(wildcards) -> str:
        """The TREC run tag of a fused row, e.g. none-seed-13-r2-bm25."""
        return "-".join([wildcards.method, *Path(wildcards.fused).parts, "bm25"])

    def selection_files(self) -> list[str]:
        """Every selection.json and fusion.json of the run: the comparison's section on held-out
        queries reads them."""
        files = []
        for c in self.rows.training_collections():
            if self.selects_settings():
                files += [
                    self.chosen_file(SimpleNamespace(collection=c, method=m, seed=s), "selection.json")
                    for m in self.methods
                    for s in self.rows.seeds(m)
                ]
            for m in self.methods:
                for s in self.rows.seeds(m):
                    seed = SimpleNamespace(collection=c, method=m, seed=s)
                    if self.selects_negatives(m):
                        files.append(self.chosen_file(seed, NEGATIVES_GRID, "selection.json"))
                    if self.selects_reranker(m):
                        files.append(self.reranker_selection(seed))
                    if self.selects_distill(m):
                        files.append(self.chosen_file(seed, DISTILL_GRID, "selection.json"))
            if self.fusion["method"] == "convex":
                for row in self.rows.fused():
                    method, fused = rows.unfused(row).split("/", 1)
                    files.append(self.fusion_file(SimpleNamespace(collection=c, method=method, fused=fused)))
        return list(dict.fromkeys(files))
