# BM25 with Lucene (Anserini): the index, the evaluation run, and the training negatives (K1).


rule bm25_index:
    input:
        code=stage_code("bm25_index"),
        passages=rules.split_passages.output.passages,
    output:
        index=directory(f"{RESULTS}/{{collection}}/bm25/index"),
    log:
        f"{LOGS}/{{collection}}/bm25_index.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/bm25_index.tsv"
    # on the longest chain (negatives, trainings): ahead of other ready jobs, e.g. zero-shot encoding
    priority: 1
    conda:
        "../envs/bm25.yaml"
    threads: 2
    resources:
        mem_mb=RESOURCES.bm25_mem_mb,
        runtime=RESOURCES.bm25_runtime,
        java_heap_mb=RESOURCES.bm25_heap_mb,
    shell:
        "python -m dprflow.stages.bm25_index --passages {input.passages:q} --index {output.index:q}"
        " --threads {threads} --heap-mb {resources.java_heap_mb:q} > {log:q} 2>&1"


rule bm25_search:
    input:
        code=stage_code("bm25_search"),
        index=rules.bm25_index.output.index,
        queries=rules.ingest.output.queries,
    output:
        run=f"{RESULTS}/{{collection}}/bm25/run.parquet",
        trec=f"{RESULTS}/{{collection}}/bm25/run.trec",
    log:
        f"{LOGS}/{{collection}}/bm25_search.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/bm25_search.tsv"
    conda:
        "../envs/bm25.yaml"
    threads: 2
    resources:
        mem_mb=RESOURCES.bm25_mem_mb,
        runtime=RESOURCES.bm25_runtime,
        java_heap_mb=RESOURCES.bm25_heap_mb,
    params:
        split=COLLECTIONS.eval_split,
        k=config["bm25"]["hits"],
        k1=config["bm25"]["k1"],
        b=config["bm25"]["b"],
    shell:
        "python -m dprflow.stages.bm25_search --index {input.index:q} --queries {input.queries:q}"
        " --split {params.split:q} --out {output.run:q} --trec {output.trec:q} --k {params.k:q}"
        " --k1 {params.k1:q} --b {params.b:q} --threads {threads} --heap-mb {resources.java_heap_mb:q} > {log:q} 2>&1"


rule bm25_negatives:
    input:
        code=stage_code("bm25_negatives"),
        index=rules.bm25_index.output.index,
        queries=rules.ingest.output.queries,
        qrels=rules.ingest.output.qrels,
        passages=rules.split_passages.output.passages,
    output:
        negatives=f"{RESULTS}/{{collection}}/bm25/negatives.parquet",
    log:
        f"{LOGS}/{{collection}}/bm25_negatives.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/bm25_negatives.tsv"
    # on the longest chain (negatives, trainings): ahead of other ready jobs, e.g. zero-shot encoding
    priority: 1
    conda:
        "../envs/bm25.yaml"
    threads: 2
    resources:
        mem_mb=RESOURCES.bm25_mem_mb,
        runtime=RESOURCES.bm25_runtime,
        java_heap_mb=RESOURCES.bm25_heap_mb,
    params:
        split=COLLECTIONS.train_split,
        depth=config["bm25"]["negatives_depth"],
        k1=config["bm25"]["k1"],
        b=config["bm25"]["b"],
    shell:
        "python -m dprflow.stages.bm25_negatives --index {input.index:q} --queries {input.queries:q}"
        " --qrels {input.qrels:q} --passages {input.passages:q} --split {params.split:q}"
        " --out {output.negatives:q} --depth {params.depth:q} --k1 {params.k1:q} --b {params.b:q}"
        " --threads {threads} --heap-mb {resources.java_heap_mb:q} > {log:q} 2>&1"
