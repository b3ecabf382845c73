def bm25_heap_mb(wildcards):
    # A resource, not a param: a larger heap changes no output, so it must not rerun the jobs.
    return config["bm25"]["heap_mb"]


def bm25_mem_mb(wildcards):
    # The JVM's heap, plus its own memory and Python's (one batch of passages or one call's hits,
    # about 0.5 GB measured), plus the index's memory-mapped pages (70 bytes a passage measured).
    return int(
        config["bm25"]["heap_mb"]
        + 1536
        + passages_estimate(wildcards.collection) / 10_000
    )


def bm25_runtime(wildcards):
    return int(15 + passages_estimate(wildcards.collection) / 60_000)
