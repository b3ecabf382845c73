"""dprflow.plan.resources: what the jobs ask a cluster for, from the config's sizes, and how a
training job starts (python, or torchrun with a process per GPU)."""

from __future__ import annotations

from types import SimpleNamespace as W

from config_edits import default_config

from dprflow.plan.resources import EMBED_BYTES, ResourceEstimates, training_launcher


def estimates(**collection) -> ResourceEstimates:
    config = default_config()
    config["collections"] = {"c": collection}
    return ResourceEstimates(config)


def test_sizes_from_the_size_entry_max_documents_or_a_million():
    assert estimates(size={"passages": 8_841_823, "train_queries": 502_939}).passages("c") == 8_841_823
    assert estimates(size={"passages": 8_841_823}).train_queries("c") == 884_182  # a tenth
    assert estimates(max_documents=200).passages("c") == 600
    assert estimates().passages("c") == 1_000_000


def test_memory_and_runtime_grow_with_the_corpus_and_the_batch():
    small, large = estimates(max_documents=1_000), estimates(size={"passages": 8_841_823})
    w = W(collection="c")
    for name in ("bm25_mem_mb", "bm25_runtime", "encode_mem_mb", "search_mem_mb", "search_runtime"):
        assert getattr(small, name)(w) < getattr(large, name)(w), name
    # the flat index of MS MARCO's passages in float32 at BERT-base's width, 1.5 times
    assert large.search_mem_mb(w) == int(3000 + 1.5 * 8_841_823 * EMBED_BYTES / 2**20)
    assert large.bm25_heap_mb(w) == default_config()["bm25"]["heap_mb"]  # a resource, not a param
    section = {"batch_size": 64, "group_size": 8, "max_steps": 0, "epochs": 3}
    mem, runtime = large.training(section, "c")
    assert mem == 4000 + 20 * 64 * 8
    assert large.train_steps(section, "c") == 3 * (884_182 // 64 + 1)
    assert runtime > small.training(section, "c")[1]
    assert large.training({**section, "max_steps": 10}, "c")[1] == int(30 + 10 * 2.0 * 8 / 60)


def test_search_one_shard_at_a_time_holds_one_shard():
    config = default_config()
    config["collections"] = {"c": {"size": {"passages": 8_000_000}}}
    config["finetune"].update(encode_shards=8, search_shard_at_a_time=True)
    sharded = ResourceEstimates(config).search_mem_mb(W(collection="c"))
    config["finetune"]["search_shard_at_a_time"] = False
    assert sharded < ResourceEstimates(config).search_mem_mb(W(collection="c")) / 4


def test_a_training_job_with_several_gpus_starts_torchrun():
    assert training_launcher(W(), {}) == "python"
    assert training_launcher(W(), {"gpu": 1}) == "python"
    assert training_launcher(W(), {"gpu": 4}) == "torchrun --standalone --nproc-per-node 4"
