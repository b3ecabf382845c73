"""The comparison table: every system on every collection, beside the reference rows.

Input is the per-query metric tables written by the ``evaluate`` stage, one per (collection,
system). Output is a long table (``collection, system, metric, value, n_queries`` plus the
significance columns) for programs, and a Markdown table for people.

Seeds: a fine-tuned system evaluated once per seed is named ``<method>/seed-<seed>/<stage>``; its
row in the table is ``<method>/<stage>``, with ``value`` the mean over seeds of the per-seed means,
``std`` their sample standard deviation (n - 1; empty with one seed) and ``n_seeds``.

Significance: each row is compared with each reference row (the configured baseline, BM25 by
default, and the off-the-shelf model ``none/zeroshot``) by a two-sided paired test over the
queries, per collection and metric: the t-test, or Fisher's randomization test (sign flipping of
the per-query differences; Smucker, Allan and Carterette, CIKM 2007, recommend it for IR; ranx
and PyTerrier offer it too). With seeds the differences are paired per query and seed (a row
without seeds, such as BM25, has the same value for every seed), over the seeds both rows share:
with two or more, the t-test is the test over queries and seeds of
:mod:`dprflow.evaluation.crossed`, which counts the seeds' spread as well as the queries' (a
difference one seed made is not taken for one every seed shows); the randomization test flips the
signs of each query's seed-averaged difference, so it counts the queries' spread only. The
p-values of one (collection, metric, reference) family are corrected for multiple comparisons with
Holm-Bonferroni, as PyTerrier's ``Experiment`` does with ``correction='holm'``.

Power: ``mdd_<R>`` is the smallest true difference the design would find against reference R with
probability 0.8 at two-sided level 0.05 / m, m the family's size (Holm's strictest threshold, so
it holds whatever the row's rank): the t-test's (:func:`dprflow.evaluation.crossed.detectable_difference`,
over queries and seeds as above), also for the randomization test, whose power over this many
queries is close to the t-test's. A row marked not different is then read as "no difference of
``mdd`` or more", not as "no difference".

Transfer: a row can be scored on another collection than the one it was trained on (BEIR's
zero-shot tables: models trained on MS MARCO, scored on each BEIR set). Each row of the long table
then names its ``training_collection`` (empty for rows that train nothing: BM25 and the
off-the-shelf models), and the Markdown table has one column group per (scored collection,
training collection) and, per training collection scored on several collections, a group of the
means over them. Significance families stay per scored collection: every row scored on it, native
or transferred, against the same reference rows on the same queries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from dprflow.plan import rows as plan_rows
from dprflow.plan.rows import sort_key as system_sort_key
from dprflow.plan.rows import split_seed

# The long table's leading columns (then training_collection and the significance columns).
ROW_COLUMNS = ["collection", "system", "metric", "value", "std", "n_seeds", "seeds", "n_queries"]
ALPHA = 0.05


def holm(pvalues: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (NaN entries are left out and stay NaN)."""
    idx = [i for i, p in enumerate(pvalues) if not math.isnan(p)]
    order = sorted(idx, key=lambda i: pvalues[i])
    m = len(order)
    adjusted = [float("nan")] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def paired_ttest(a: pd.Series, b: pd.Series) -> float:
    """Two-sided paired t-test p-value over the queries both have; NaN when undefined."""
    joined = pd.concat([a, b], axis=1, join="inner").dropna()
    if len(joined) < 2:
        return float("nan")
    diff = joined.iloc[:, 0] - joined.iloc[:, 1]
    if np.allclose(diff, 0):
        return 1.0
    if np.allclose(diff, diff.iloc[0]):
        return 0.0  # the same non-zero difference on every query: no variance, certainly different
    from scipy import stats  # here, not at the top: only the t-tests need scipy (issue 15)

    return float(stats.ttest_rel(joined.iloc[:, 0], joined.iloc[:, 1]).pvalue)


SIGNIFICANCE_TESTS = ("t-test", "randomization")


def paired_randomization(a: pd.Series, b: pd.Series, permutations: int = 10000, seed: int = 0) -> float:
    """Two-sided p-value of Fisher's paired randomization test over the queries both have.

    Under the null hypothesis the two systems are exchangeable on each query, so each per-query
    difference is as likely to carry either sign. The statistic is the mean difference; the
    p-value is the share of sign assignments whose mean is at least as far from 0 as the observed
    one. With ``2**n <= permutations`` every assignment is enumerated (the exact test); otherwise
    ``permutations`` random ones are drawn with ``seed`` and ``p = (hits + 1) / (permutations + 1)``,
    counting the observed assignment (Phipson and Smyth, 2010), so p is never 0. NaN when fewer
    than two queries are shared. scipy's ``permutation_test(..., permutation_type="samples")``
    computes the same p-value.
    """
    joined = pd.concat([a, b], axis=1, join="inner").dropna()
    if len(joined) < 2:
        return float("nan")
    diff = (joined.iloc[:, 0] - joined.iloc[:, 1]).to_numpy(dtype=np.float64)
    n = len(diff)
    observed = abs(diff.mean())
    tolerance = 1e-12 * max(1.0, observed)  # equal means up to float rounding count as hits
    if 2**n <= permutations:
        signs = 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1)  # [2^n, n]: every assignment
        return float((np.abs(signs @ diff / n) >= observed - tolerance).mean())
    rng = np.random.default_rng(seed)
    hits = 0
    for start in range(0, permutations, 1024):  # [chunk, n] sign matrices, memory bounded
        signs = rng.choice((-1.0, 1.0), size=(min(1024, permutations - start), n))
        hits += int((np.abs(signs @ diff / n) >= observed - tolerance).sum())
    return (hits + 1) / (permutations + 1)


def paired_test(
    a: pd.Series, b: pd.Series, test: str = "t-test", permutations: int = 10000, seed: int = 0
) -> float:
    """The two-sided p-value of the paired ``test`` (:data:`SIGNIFICANCE_TESTS`)."""
    if test == "t-test":
        return paired_ttest(a, b)
    if test == "randomization":
        return paired_randomization(a, b, permutations, seed)
    raise ValueError(f"unknown significance test {test!r}; allowed: {', '.join(SIGNIFICANCE_TESTS)}")


def seed_matrix(by_seed: dict[int | None, pd.DataFrame], metric: str) -> pd.DataFrame:
    """Per-query values of one metric, a column per seed (index query_id)."""
    return pd.DataFrame(
        {
            seed: table[table["metric"] == metric].set_index("query_id")["value"]
            for seed, table in by_seed.items()
        }
    )


def paired_differences(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Per-query differences ``a - b`` of two :func:`seed_matrix` tables, a column per seed both
    rows have (a side without seeds, one column of seed None, counts as the same values for
    every seed), over the queries both have (a query missing from either is left out)."""
    if None in b.columns:
        diff = a.sub(b[None], axis=0)
    elif None in a.columns:
        diff = b.rsub(a[None], axis=0)
    else:
        common = [s for s in a.columns if s in b.columns]
        diff = a[common] - b[common]
    return diff.dropna()


def family_tests(
    diffs: list[pd.DataFrame], test: str, permutations: int, seed: int
) -> tuple[list[float], list[float]]:
    """Holm-corrected p-values and detectable differences (module docstring, "Power") of one
    family of comparisons, each given as its :func:`paired_differences`. With one seed, or with
    the randomization test, the paired test of each query's seed-averaged difference."""
    from dprflow.evaluation.crossed import crossed_test, detectable_difference

    testable = [len(diff) >= 2 and diff.shape[1] >= 1 for diff in diffs]
    level = ALPHA / max(sum(testable), 1)  # Holm's strictest threshold: m the family's tests
    raw, detectable = [], []
    for diff, ok in zip(diffs, testable, strict=True):
        if not ok:
            raw.append(float("nan"))
            detectable.append(float("nan"))
            continue
        crossed = crossed_test(diff.to_numpy())
        if test == "t-test" and diff.shape[1] >= 2:
            raw.append(crossed.p)
        else:
            averaged = diff.mean(axis=1)
            raw.append(paired_test(averaged, averaged * 0.0, test, permutations, seed))
        detectable.append(detectable_difference(crossed, alpha=level))
    return holm(raw), detectable


def reference_row(out: pd.DataFrame, idx, ref: str, collection: str):
    """The index of reference row ``ref`` among the rows ``idx`` of one scored collection: the one
    trained on nothing or on that collection, else the only one; None when absent or ambiguous
    (a trained baseline transferred from several collections)."""
    rows = [i for i in idx if out.at[i, "system"] == ref]
    native = [i for i in rows if out.at[i, "training_collection"] in ("", collection)]
    if native:
        return native[0]
    return rows[0] if len(rows) == 1 else None


def build_comparison(
    per_query: dict[tuple[str, ...], pd.DataFrame],
    references: list[str],
    test: str = "t-test",
    permutations: int = 10000,
    seed: int = 0,
) -> pd.DataFrame:
    """Long table of aggregates and significance against each reference system.

    ``test``: the paired test (:func:`paired_test`: ``t-test`` or ``randomization``, with
    ``permutations`` and ``seed``); its p-values are Holm-corrected per family either way.

    ``per_query`` maps (collection, system), or (collection, system, training collection) for
    a row scored on one collection and trained on another (module docstring), to a
    (query_id, metric, value) table; systems named ``<method>/seed-<seed>/<stage>`` are gathered
    into one row ``<method>/<stage>`` (module docstring). For each reference R, the columns
    ``p_<R>`` (Holm-adjusted p-value), ``delta_<R>`` (value minus R's) and ``mdd_<R>`` (the
    detectable difference, module docstring) are added; they are NaN for R itself or when R is
    absent from the collection.
    """
    grouped: dict[tuple[str, str, str], dict[int | None, pd.DataFrame]] = {}
    for key, table in per_query.items():
        collection, system, trained = (*key, "")[:3]
        # row_seed, not seed: ``seed`` is the randomization test's
        name, row_seed = split_seed(system)
        seeds = grouped.setdefault((collection, name, trained), {})
        if row_seed in seeds or (seeds and (row_seed is None) != (None in seeds)):
            raise ValueError(f"{collection} {system}: the same row twice, or with and without a seed")
        seeds[row_seed] = table
    rows = []
    matrices: dict[tuple[str, str, str, str], pd.DataFrame] = {}
    for (collection, system, trained), by_seed in grouped.items():
        metrics = dict.fromkeys(m for t in by_seed.values() for m in t["metric"])
        for metric in metrics:
            values = matrices[(collection, system, trained, metric)] = seed_matrix(by_seed, metric)
            means = values.mean(axis=0)
            std = float(means.std(ddof=1)) if len(means) > 1 else float("nan")
            seeds = " ".join(str(s) for s in sorted(by_seed) if s is not None)
            rows.append(
                (
                    collection,
                    system,
                    metric,
                    float(means.mean()),
                    std,
                    len(means),
                    seeds,
                    int(values.index.nunique()),
                    trained,
                )
            )
    out = pd.DataFrame(
        rows,
        columns=[*ROW_COLUMNS, "training_collection"],
    )
    for ref in references:
        key = ref.replace("/", "_")
        out[f"delta_{key}"] = np.nan
        out[f"p_{key}"] = np.nan
        out[f"mdd_{key}"] = np.nan
        for (collection, metric), idx in out.groupby(["collection", "metric"]).groups.items():
            ref_row = reference_row(out, idx, ref, collection)
            if ref_row is None:
                continue
            ref_value = float(out.at[ref_row, "value"])
            ref_matrix = matrices[(collection, ref, out.at[ref_row, "training_collection"], metric)]
            diffs, where = [], []
            for i in idx:
                system = out.at[i, "system"]
                if i == ref_row:
                    continue
                matrix = matrices[(collection, system, out.at[i, "training_collection"], metric)]
                diffs.append(paired_differences(matrix, ref_matrix))
                where.append(i)
                out.at[i, f"delta_{key}"] = out.at[i, "value"] - ref_value
            adjusted, detectable = family_tests(diffs, test, permutations, seed)
            for i, p, d in zip(where, adjusted, detectable, strict=True):
                out.at[i, f"p_{key}"] = p
                out.at[i, f"mdd_{key}"] = d
    return out


def reference_letters(references: list[str]) -> dict[str, str]:
    """The marker letter of each reference: b for the baseline, z for the off-the-shelf row, then
    c, d, ... for the others (evaluation.also_against), in order."""
    letters, others = {}, iter("cdefghijklmnopqrstuvwxy")
    for i, ref in enumerate(references):
        letters[ref] = "b" if i == 0 else "z" if ref == plan_rows.OFF_THE_SHELF else next(others)
    return letters


def _marker(row: pd.Series, references: list[str], letters: dict[str, str]) -> str:
    marks = []
    for ref in references:
        key = ref.replace("/", "_")
        p = row.get(f"p_{key}", float("nan"))
        if p == p and p < ALPHA:
            marks.append(letters[ref] + ("↑" if row[f"delta_{key}"] > 0 else "↓"))
    return (" " + " ".join(marks)) if marks else ""


def encoder_label(table: pd.DataFrame, system: str) -> str:
    """How a row scored: ``pooling, similarity`` of a dense row (its ``pooling`` and ``similarity``
    columns), ``BM25``, or ``cross-encoder`` for a reranked row."""
    rows = table[table["system"] == system]
    pairs = rows[["pooling", "similarity"]].dropna().drop_duplicates()
    if not pairs.empty:
        return " / ".join(f"{p}, {s}" for p, s in pairs.itertuples(index=False))
    if system == plan_rows.BM25:
        return "BM25"
    if plan_rows.is_fused(system):
        return "fused with BM25"
    return "cross-encoder" if system.endswith("/rerank") else "–"


def scored_queries_note(
    table: pd.DataFrame, splits: dict[str, str] | None = None, trained_on: Sequence[str] = ()
) -> str:
    """Which split of each collection was scored and on how many queries; a split the models
    trained on (``score_training_queries``) is said to be one."""
    nq = table.groupby("collection")["n_queries"].max()
    parts = []
    for c in dict.fromkeys(table["collection"]):
        text = f"{c}: {int(nq[c])}"
        if splits and c in splits:
            text += f" queries of split {splits[c]!r}"
            if c in trained_on:
                text += " (the training queries: the models trained on them, so these scores do not measure retrieval of unseen queries)"
        parts.append(text)
    return "Queries scored: " + ", ".join(parts) + "."


def column_groups(table: pd.DataFrame, order: Sequence[str] = ()) -> list[tuple[str, str]]:
    """(scored collection, training collection) of each column group: one per collection and each
    collection whose rows were scored on it, collections in ``order`` (the config's) first, then
    in the table's order; a collection scored by untrained rows only has the training collection ''."""
    trained = table.get("training_collection", pd.Series("", index=table.index)).fillna("")
    present = list(dict.fromkeys(table["collection"]))
    groups = []
    for c in [c for c in order if c in present] + [c for c in present if c not in order]:
        sources = list(dict.fromkeys(t for t in trained[table["collection"] == c] if t))
        groups += [(c, t) for t in sources] or [(c, "")]
    return groups


def cell_row(indexed: pd.DataFrame, group: tuple[str, str], system: str, metric: str):
    """The long table's row of ``system`` in a column group: trained on the group's training
    collection, else one that trained on nothing (BM25, the off-the-shelf models); None if absent."""
    collection, trained = group
    for key in ((collection, trained, system, metric), (collection, "", system, metric)):
        if key in indexed.index:
            return indexed.loc[key]
    return None


def to_markdown(
    table: pd.DataFrame,
    references: list[str],
    methods: list[str],
    metrics: list[str],
    splits: dict[str, str] | None = None,
    trained_on: Sequence[str] = (),
    test: str = "t-test",
    permutations: int = 10000,
) -> str:
    """One row per system, one column per (collection, metric); significance markers in the cells.
    ``splits`` names the query split scored per collection, ``trained_on`` the collections whose
    scored split is their training split; the notes say both. With ``pooling`` and
    ``similarity`` columns (the comparison stage adds them from each dense run's
    ``encoder.json``) an ``encoder`` column says how each row embedded and scored."""
    letters = reference_letters(references)
    metric_order = [m for m in metrics if m in set(table["metric"])]
    systems = sorted(set(table["system"]), key=lambda s: system_sort_key(s, methods))
    geometry = {"pooling", "similarity"} <= set(table.columns)
    if "training_collection" not in table:
        table = table.assign(training_collection="")
    table = table.assign(training_collection=table["training_collection"].fillna(""))
    groups = column_groups(table, list(splits or ()))
    transfer = any(t and t != c for c, t in groups)
    # BEIR's mean column: per training collection scored on several collections
    means = [t for t in dict.fromkeys(t for _, t in groups) if t and sum(g[1] == t for g in groups) > 1]
    labels = [f"{c} (trained on {t})" if transfer and t else c for c, t in groups]
    labels += [f"mean of {sum(g[1] == t for g in groups)} collections (trained on {t})" for t in means]
    header = (
        ["system"]
        + (["encoder"] if geometry else [])
        + [f"{label} {m}" for label in labels for m in metric_order]
    )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    indexed = table.set_index(["collection", "training_collection", "system", "metric"])
    for system in systems:
        cells = [system] + ([encoder_label(table, system)] if geometry else [])
        for group in groups:
            for m in metric_order:
                row = cell_row(indexed, group, system, m)
                if row is not None:
                    std = row.get("std", float("nan"))
                    spread = f" ± {std:.4f}" if std == std else ""
                    cells.append(f"{row['value']:.4f}{spread}{_marker(row, references, letters)}")
                else:
                    cells.append("–")
        for t in means:
            for m in metric_order:
                found = [cell_row(indexed, g, system, m) for g in groups if g[1] == t]
                cells.append(
                    "–" if any(r is None for r in found) else f"{np.mean([r['value'] for r in found]):.4f}"
                )
        lines.append("| " + " | ".join(cells) + " |")
    notes = ["", scored_queries_note(table, splits, trained_on)]
    if transfer:
        notes.append(
            'Transfer: a column group "X (trained on Y)" scores on X\'s queries the rows trained on Y '
            "(BM25 and the off-the-shelf rows train nothing and are X's own); a mean group averages a "
            "row's values over the collections its training collection was scored on, without markers."
        )
    if "n_seeds" in table and (table["n_seeds"] > 1).any():
        seeds = sorted({s for v in table["seeds"].dropna() for s in str(v).split()}, key=int)
        notes.append(
            f"Fine-tuned rows: mean ± sample standard deviation over each row's seeds (of {', '.join(seeds)}; "
            "a row without ± has one; the pre-trained encoders are shared by all seeds); the paired "
            "test pairs each query's values per seed both rows have"
            + (
                ", and counts the seeds' spread beside the queries' (a two-way random-effects test)."
                if test == "t-test"
                else ", averaged over those seeds (the queries' spread only)."
            )
        )
    notes += [
        f"Markers: {test_name(test, permutations)} over queries against a reference row, Holm-corrected per "
        f"collection, metric and reference, p < {ALPHA}: "
        + "; ".join(f"{letters[r]}↑/{letters[r]}↓ better/worse than {r}" for r in references)
        + ".",
    ]
    return "\n".join(lines + notes) + "\n"


def test_name(test: str, permutations: int) -> str:
    """How the table's notes name the significance test."""
    if test == "randomization":
        return (
            f"paired two-sided Fisher randomization test ({permutations} sign permutations, exact when fewer)"
        )
    return "paired two-sided t-test"


def paper_numbers() -> pd.DataFrame:
    """The papers' published figures (``src/dprflow/evaluation/paper_numbers.csv``)."""
    from importlib import resources

    with resources.files("dprflow").joinpath("evaluation/paper_numbers.csv").open() as fh:
        return pd.read_csv(fh, keep_default_na=False)


def beside_papers(table: pd.DataFrame, papers: pd.DataFrame, references: dict[str, str]) -> pd.DataFrame:
    """Our value beside each published figure of the same evaluation set, method, stage and metric.

    ``references`` maps a collection to the evaluation-set id the papers use (e.g.
    ``msmarco-passage/dev``); only those collections are compared. Published rows without a
    matching row of ours keep ``ours`` empty, so the table also shows what is not reproduced yet.
    """
    rows = []
    if "training_collection" in table:  # rows transferred from another collection are not the papers'
        trained = table["training_collection"].fillna("")
        table = table[trained.eq("") | trained.eq(table["collection"])]
    ours = table.set_index(["collection", "system", "metric"])["value"]
    for collection, reference in references.items():
        for r in papers[papers["reference"] == reference].itertuples(index=False):
            system = "bm25" if r.method == "bm25" else f"{r.method}/{r.stage}"
            value = ours.get((collection, system, r.metric), float("nan"))
            rows.append(
                (
                    collection,
                    r.paper,
                    r.table,
                    system,
                    r.metric,
                    float(r.value),
                    value,
                    value - float(r.value),
                )
            )
    return pd.DataFrame(
        rows,
        columns=["collection", "paper", "table", "system", "metric", "paper_value", "ours", "difference"],
    )


def papers_markdown(beside: pd.DataFrame) -> str:
    if beside.empty:
        return ""
    lines = [
        "",
        "## Beside the papers",
        "",
        "| collection | paper | table | system | metric | paper | ours | difference |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in beside.itertuples(index=False):
        ours = "–" if r.ours != r.ours else f"{r.ours:.4f}"
        diff = "–" if r.difference != r.difference else f"{r.difference:+.4f}"
        lines.append(
            f"| {r.collection} | {r.paper} | {r.table} | {r.system} | {r.metric} | {r.paper_value:.4f} | {ours} | {diff} |"
        )
    return "\n".join(lines) + "\n"
