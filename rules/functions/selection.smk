from types import SimpleNamespace

# The selection's helpers (finetune.select, finetune.fusion; docs/selection.md): which grid points
# train, what each job reads, and the flags of the choice and of the fused rows.

SELECT = FT["select"]
FUSION = FT["fusion"]
# The grid's points by folder name, in grid order ({} is the settings as configured).
POINTS = {point_name(p): p for p in grid_points(SELECT["retriever"])}
HELDOUT_QUERIES = f"{RESULTS}/{{collection}}/collection/heldout_queries.parquet"


def selects_settings():
    """Whether r1 and r2 train with settings chosen on held-out queries (a grid with a choice)."""
    return bool(SELECT["retriever"])


def selection_file(wildcards):
    """The selection.json that r1 and r2 of a method and seed read, when a grid chooses."""
    if wildcards.trained in ("r1", "r2") and selects_settings():
        seed = plan_rows.seed_folder(wildcards.seed)
        return [
            result_path(
                wildcards.collection, wildcards.method, seed, "select", "selection.json"
            )
        ]
    return []


def selection_flag(wildcards):
    """--selection of r1 and r2 when a grid chooses their settings (the path rebuilt from the
    wildcards, not read from input: see the note at the top of rules/common.smk)."""
    files = selection_file(wildcards)
    return f" --selection {q(files[0])}" if files else ""


def is_point(wildcards):
    return wildcards.trained.startswith("select/")


def point_settings(wildcards):
    """The settings a grid point trains with (its folder name: POINTS)."""
    name = wildcards.trained.split("/", 1)[1]
    if name not in POINTS:
        raise ValueError(
            f"{name!r} is not a point of finetune.select.retriever's grid: {', '.join(POINTS)}"
        )
    return POINTS[name]


def training_queries(wildcards):
    """The queries a retriever trains on: a grid point reads the held-out split's table (its fit
    part), so that it can never read a test or a held-out query."""
    if is_point(wildcards):
        return HELDOUT_QUERIES.format(collection=wildcards.collection)
    return result_path(wildcards.collection, "collection", "queries.parquet")


def training_split(wildcards):
    return "fit" if is_point(wildcards) else train_split(wildcards)


def heldout_chooser_inputs(wildcards):
    """What a selection.json is chosen from: every grid point's (or the model off the shelf's)
    held-out metrics and run, and BM25's held-out run when a fused row needs a weight.
    """
    c, m = wildcards.collection, wildcards.method
    if wildcards.chooser == plan_rows.ZEROSHOT:
        runs = [result_path(c, m, plan_rows.ZEROSHOT, "heldout")]
    else:
        runs = [result_path(c, m, wildcards.chooser, p, "heldout") for p in POINTS]
    out = {
        "metrics": [f"{r}/metrics.parquet" for r in runs],
        "runs": [f"{r}/run.parquet" for r in runs],
        "queries": HELDOUT_QUERIES.format(collection=wildcards.collection),
        "qrels": result_path(wildcards.collection, "collection", "qrels.parquet"),
        "passages": result_path(wildcards.collection, "passages.parquet"),
    }
    if chooses_weight(wildcards.chooser):
        out["bm25"] = result_path(
            wildcards.collection, "bm25", "heldout", "run.parquet"
        )
    return out


def chooses_weight(chooser):
    """Whether a selection.json also holds a fused row's weight: for the convex combination only,
    and only where a fused row reads it (zeroshot's for zeroshot+bm25, a seed's for the others).
    """
    if FUSION["method"] != "convex":
        return False
    rows = set(FUSION["rows"])
    if chooser == plan_rows.ZEROSHOT:
        return plan_rows.ZEROSHOT in rows
    return bool(rows - {plan_rows.ZEROSHOT})


def chooser_flags(wildcards):
    """The grid (in the order of the metrics and runs files) and the fusion weights to try."""
    grid = [{}] if wildcards.chooser == "zeroshot" else list(POINTS.values())
    flags = f"--grid {q(json.dumps(grid))} --metric {q(SELECT['metric'])}"
    if chooses_weight(wildcards.chooser):
        c = wildcards.collection
        flags += (
            f" --bm25-run {q(result_path(c, 'bm25', 'heldout', 'run.parquet'))}"
            f" --queries {q(HELDOUT_QUERIES.format(collection=c))}"
            f" --qrels {q(result_path(c, 'collection', 'qrels.parquet'))}"
            f" --passages {q(result_path(c, 'passages.parquet'))}"
            f" --fusion-method convex --weights {' '.join(q(w) for w in FUSION['weights'])}"
            f" --depth {q(FT['search_depth'])}"
        )
    return flags


def fused_inputs(wildcards):
    """The dense run, BM25's run of the same queries and, for the convex combination, the
    selection.json holding the weight chosen on held-out queries."""
    c = wildcards.collection
    out = {
        "dense": result_path(c, wildcards.method, wildcards.fused, "run.parquet"),
        "bm25": result_path(c, plan_rows.BM25, "run.parquet"),
    }
    if FUSION["method"] == "convex":
        out["selection"] = fusion_selection(wildcards)
    return out


def fusion_selection(wildcards):
    """Where a fused row's weight was chosen: the model off the shelf's held-out run for a
    zeroshot row, else retriever 1 of the best grid point trained on the fit part."""
    base = result_path(wildcards.collection, wildcards.method)
    if wildcards.fused == "zeroshot":
        return f"{base}/zeroshot/selection.json"
    seed = wildcards.fused.split("/")[0]
    return f"{base}/{seed}/select/selection.json"


def fuse_flags(wildcards):
    flags = f"--method {q(FUSION['method'])} --rrf-k {q(FUSION['rrf_k'])} --depth {q(FT['search_depth'])}"
    if FUSION["method"] == "convex":
        flags += f" --selection {q(fusion_selection(wildcards))}"
    return flags


def fused_tag(wildcards):
    return "-".join([wildcards.method, *Path(wildcards.fused).parts, "bm25"])


def selection_files():
    """Every selection.json of the run: the comparison's section on held-out queries reads them."""
    files = []
    for c in training_collections():
        if selects_settings():
            files += [
                f"{RESULTS}/{c}/{m}/seed-{s}/select/selection.json"
                for m in config["methods"]
                for s in finetune_seeds()
            ]
        if FUSION["method"] == "convex":
            for row in fused_rows():
                method, fused = plan_rows.unfused(row).split("/", 1)
                where = SimpleNamespace(collection=c, method=method, fused=fused)
                files.append(fusion_selection(where))
    return list(dict.fromkeys(files))
