# Settings chosen on held-out training queries, and dense rows fused with BM25 (finetune.select,
# finetune.fusion; docs/selection.md). The grid points train with rule train_retriever and encode
# with encode_corpus (retriever seed-<seed>/select/<point>), the reranker grid's with
# train_reranker and rerank (seed-<seed>/select/rerank/<point>); the rules here split the training
# queries, search and score the held-out part, choose the settings (select_settings), choose a
# fused row's weight (select_fusion, a job of its own so that a change to the fusion retrains
# nothing), and fuse.


rule heldout_queries:
    input:
        code=stage_code("heldout_queries"),
        queries=rules.ingest.output.queries,
        qrels=rules.ingest.output.qrels,
    output:
        queries=SELECTION.heldout_queries,
    log:
        f"{LOGS}/{{collection}}/heldout_queries.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/heldout_queries.tsv"
    conda:
        "../envs/evaluation.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=15,
    params:
        split=COLLECTIONS.train_split,
        fraction=SELECT["fraction"],
        max_queries=SELECT["max_queries"],
        min_queries=SELECT["min_queries"],
        seed=SELECT["seed"],
    shell:
        "python -m dprflow.stages.heldout_queries --queries {input.queries:q} --qrels {input.qrels:q}"
        " --split {params.split:q} --out {output.queries:q} --fraction {params.fraction:q}"
        " --max-queries {params.max_queries:q} --min-queries {params.min_queries:q} --seed {params.seed:q}"
        " > {log:q} 2>&1"


rule bm25_heldout:
    input:
        code=stage_code("bm25_search"),
        index=rules.bm25_index.output.index,
        queries=SELECTION.heldout_queries,
    output:
        run=f"{RESULTS}/{{collection}}/bm25/heldout/run.parquet",
        trec=f"{RESULTS}/{{collection}}/bm25/heldout/run.trec",
    log:
        f"{LOGS}/{{collection}}/bm25_heldout.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/bm25_heldout.tsv"
    conda:
        "../envs/bm25.yaml"
    threads: 2
    resources:
        mem_mb=RESOURCES.bm25_mem_mb,
        runtime=RESOURCES.bm25_runtime,
        java_heap_mb=RESOURCES.bm25_heap_mb,
    params:
        k=config["bm25"]["hits"],
        k1=config["bm25"]["k1"],
        b=config["bm25"]["b"],
    shell:
        "python -m dprflow.stages.bm25_search --index {input.index:q} --queries {input.queries:q}"
        " --split heldout --out {output.run:q} --trec {output.trec:q} --k {params.k:q}"
        " --k1 {params.k1:q} --b {params.b:q} --threads {threads} --heap-mb {resources.java_heap_mb:q} > {log:q} 2>&1"


# A part of the held-out split searched: the held-out queries (scored, at search_depth), or the
# fit queries (at mining_depth: the pool the negatives' grid draws from, mine_negatives).
rule search_heldout:
    input:
        code=stage_code("search_dense"),
        embeddings=FINETUNE.embedding_shards,
        queries=SELECTION.heldout_queries,
        model=FINETUNE.encoder_inputs,
    output:
        run=f"{RESULTS}/{{collection}}/{{method}}/{{retriever}}/{{part}}/run.parquet",
        trec=f"{RESULTS}/{{collection}}/{{method}}/{{retriever}}/{{part}}/run.trec",
        encoder=f"{RESULTS}/{{collection}}/{{method}}/{{retriever}}/{{part}}/encoder.json",
    log:
        f"{LOGS}/{{collection}}/{{method}}/{{retriever}}/search_{{part}}.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/{{retriever}}/search_{{part}}.tsv"
    wildcard_constraints:
        retriever=HELDOUT_RETRIEVER,
        part="heldout|fit",
    conda:
        "../envs/training.yaml"
    threads: 2
    resources:
        mem_mb=RESOURCES.search_mem_mb,
        runtime=RESOURCES.search_runtime,
    params:
        fingerprint=MODELS.init_fingerprint,
        flags=FINETUNE.search_flags,
        depth=SELECTION.part_depth,
        max_length=FT["max_query_length"],
        tag=run_tag,
    shell:
        "python -m dprflow.stages.search_dense {params.flags} --embeddings {input.embeddings:q}"
        " --queries {input.queries:q} --out {output.run:q} --trec {output.trec:q}"
        " --encoder-out {output.encoder:q} --eval-split {wildcards.part:q} --depth {params.depth:q}"
        " --max-length {params.max_length:q} --tag {params.tag:q} --threads {threads:q} > {log:q} 2>&1"


rule evaluate_heldout:
    input:
        code=stage_code("evaluate"),
        run=f"{RESULTS}/{{collection}}/{{heldout_row}}/heldout/run.parquet",
        passages=rules.split_passages.output.passages,
        queries=SELECTION.heldout_queries,
        qrels=rules.ingest.output.qrels,
    output:
        metrics=f"{RESULTS}/{{collection}}/{{heldout_row}}/heldout/metrics.parquet",
    log:
        f"{LOGS}/{{collection}}/{{heldout_row}}/evaluate_heldout.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{heldout_row}}/evaluate_heldout.tsv"
    wildcard_constraints:
        heldout_row=HELDOUT_ROW,
    conda:
        "../envs/evaluation.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        metrics=list(
            dict.fromkeys([SELECT["metric"], *config["evaluation"]["metrics"]])
        ),
    shell:
        "python -m dprflow.stages.evaluate --run {input.run:q} --passages {input.passages:q}"
        " --queries {input.queries:q} --qrels {input.qrels:q} --split heldout"
        " --out {output.metrics:q} --metrics {params.metrics:q} > {log:q} 2>&1"


rule select_settings:
    input:
        unpack(SELECTION.chooser_inputs),
        code=stage_code("select_settings"),
    output:
        selection=f"{RESULTS}/{{collection}}/{{method}}/{{chooser}}/selection.json",
    log:
        f"{LOGS}/{{collection}}/{{method}}/{{chooser}}/select_settings.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/{{chooser}}/select_settings.tsv"
    wildcard_constraints:
        chooser=f"{SEED_PATTERN}/select(/({RERANKER_GRID}|{NEGATIVES_GRID}|{DISTILL_GRID}))?",
    conda:
        "../envs/evaluation.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=15,
    params:
        flags=SELECTION.chooser_flags,
    shell:
        "python -m dprflow.stages.select_settings {params.flags} --metrics {input.metrics:q}"
        " --out {output.selection:q} > {log:q} 2>&1"


rule select_fusion:
    input:
        unpack(SELECTION.fusion_chooser_inputs),
        code=stage_code("select_fusion"),
    output:
        fusion=f"{RESULTS}/{{collection}}/{{method}}/{{chooser}}/fusion.json",
    log:
        f"{LOGS}/{{collection}}/{{method}}/{{chooser}}/select_fusion.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/{{chooser}}/select_fusion.tsv"
    wildcard_constraints:
        chooser=f"{plan_rows.ZEROSHOT}|{SEED_PATTERN}/select",
    conda:
        "../envs/evaluation.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        flags=SELECTION.fusion_chooser_flags,
    shell:
        "python -m dprflow.stages.select_fusion {params.flags} --runs {input.runs:q}"
        " --out {output.fusion:q} > {log:q} 2>&1"


rule fuse:
    input:
        unpack(SELECTION.fused_inputs),
        code=stage_code("fuse"),
    output:
        run=f"{RESULTS}/{{collection}}/{{method}}/{{fused}}+bm25/run.parquet",
        trec=f"{RESULTS}/{{collection}}/{{method}}/{{fused}}+bm25/run.trec",
    log:
        f"{LOGS}/{{collection}}/{{method}}/{{fused}}+bm25/fuse.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/{{fused}}+bm25/fuse.tsv"
    wildcard_constraints:
        fused=f"{plan_rows.ZEROSHOT}|{TRAINED_RETRIEVER}",
    conda:
        "../envs/evaluation.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        flags=SELECTION.fuse_flags,
        tag=SELECTION.fused_tag,
    shell:
        "python -m dprflow.stages.fuse {params.flags} --dense {input.dense:q} --bm25 {input.bm25:q}"
        " --out {output.run:q} --trec {output.trec:q} --tag {params.tag:q} > {log:q} 2>&1"
