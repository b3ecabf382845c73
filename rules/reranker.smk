# The cross-encoder reranker: training on retriever-2 negatives (K3), reranking retriever 2's
# evaluation run, and scoring training candidates as soft labels for the distilled retriever. A
# point of finetune.select.reranker's grid (seed-<seed>/select/rerank/<point>) trains on the fit
# part's BM25 negatives and reranks BM25's held-out run (docs/selection.md).


rule train_reranker:
    input:
        unpack(SELECTION.reranker_training),
        code=stage_code("train_reranker"),
        init=MODELS.reranker_init_input,
        qrels=rules.ingest.output.qrels,
        passages=rules.split_passages.output.passages,
    output:
        model=directory(
            f"{RESULTS}/{{collection}}/{{method}}/{SEED_DIR}/{{reranker}}/model"
        ),
    log:
        f"{LOGS}/{{collection}}/{{method}}/{SEED_DIR}/{{reranker}}/train_reranker.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/{SEED_DIR}/{{reranker}}/train_reranker.tsv"
    wildcard_constraints:
        reranker=RERANKER,
    conda:
        "../envs/training.yaml"
    threads: 2
    resources:
        mem_mb=FINETUNE.train_reranker_mem_mb,
        runtime=FINETUNE.train_reranker_runtime,
        # how often to save, not what is trained: a resource, so changing it reruns nothing
        checkpoint_every=FT["checkpoint_every"],
        log_every=config["training"]["log_every"],
        num_workers=config["training"]["num_workers"],
    params:
        fingerprint=MODELS.reranker_init_fingerprint,
        launch=training_launcher,
        init=MODELS.reranker_init(),
        split=fit_or_training_split,
        flags=FINETUNE.reranker_flags,
        checkpoints=f"{RESULTS}/{{collection}}/{{method}}/{SEED_DIR}/{{reranker}}/checkpoints",
    shell:
        "{params.launch} -m dprflow.stages.train_reranker --init {params.init:q} --queries {input.queries:q}"
        " --qrels {input.qrels:q} --passages {input.passages:q} --negatives {input.negatives:q}"
        " --split {params.split:q} --out {output.model:q} --checkpoint-dir {params.checkpoints:q}"
        " {params.flags} --checkpoint-every {resources.checkpoint_every} --log-every {resources.log_every} --num-workers {resources.num_workers} --mem-mb {resources.mem_mb}"
        " --threads {threads} > {log:q} 2>&1"


rule rerank:
    input:
        unpack(SELECTION.reranked_inputs),
        code=stage_code("rerank"),
        passages=rules.split_passages.output.passages,
    output:
        run=f"{RESULTS}/{{collection}}/{{method}}/{SEED_DIR}/{{reranked}}/run.parquet",
        trec=f"{RESULTS}/{{collection}}/{{method}}/{SEED_DIR}/{{reranked}}/run.trec",
    log:
        f"{LOGS}/{{collection}}/{{method}}/{SEED_DIR}/{{reranked}}/rerank.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/{SEED_DIR}/{{reranked}}/rerank.tsv"
    # the row (retriever 2's evaluation run), or a grid point (BM25's held-out run)
    wildcard_constraints:
        reranked=f"rerank|{RERANKER_POINT}/heldout",
    conda:
        "../envs/training.yaml"
    threads: 2
    resources:
        mem_mb=8000,
        runtime=RESOURCES.rerank_runtime,
    params:
        depth=FT["reranker"]["depth"],
        max_length=FT["reranker"]["max_length"],
        flags=precision_flag(config),
    shell:
        "python -m dprflow.stages.rerank --model {input.model:q} --run {input.run:q}"
        " --queries {input.queries:q} --passages {input.passages:q} --out {output.run:q}"
        " --trec {output.trec:q} --depth {params.depth:q} --max-length {params.max_length:q}"
        " {params.flags} --threads {threads} > {log:q} 2>&1"


# Retriever 2's run on another collection (transfer evaluation), reranked by the same reranker.
rule rerank_transfer:
    input:
        code=stage_code("rerank"),
        model=f"{RESULTS}/{{collection}}/{{method}}/{SEED_DIR}/rerank/model",
        run=f"{RESULTS}/{{collection}}/{{method}}/{SEED_DIR}/r2/{TRANSFER_DIR}/run.parquet",
        queries=COLLECTIONS.of_scored_collection(rules.ingest.output.queries),
        passages=COLLECTIONS.of_scored_collection(rules.split_passages.output.passages),
    output:
        run=f"{RESULTS}/{{collection}}/{{method}}/{SEED_DIR}/rerank/{TRANSFER_DIR}/run.parquet",
        trec=f"{RESULTS}/{{collection}}/{{method}}/{SEED_DIR}/rerank/{TRANSFER_DIR}/run.trec",
    log:
        f"{LOGS}/{{collection}}/{{method}}/{SEED_DIR}/{TRANSFER_DIR}/rerank.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/{SEED_DIR}/{TRANSFER_DIR}/rerank.tsv"
    conda:
        "../envs/training.yaml"
    threads: 2
    resources:
        mem_mb=8000,
        runtime=RESOURCES.rerank_runtime,
    params:
        depth=FT["reranker"]["depth"],
        max_length=FT["reranker"]["max_length"],
        precision=config["precision"],
    shell:
        "python -m dprflow.stages.rerank --model {input.model:q} --run {input.run:q}"
        " --queries {input.queries:q} --passages {input.passages:q} --out {output.run:q}"
        " --trec {output.trec:q} --depth {params.depth:q} --max-length {params.max_length:q}"
        " --precision {params.precision:q} --threads {threads:q} > {log:q} 2>&1"


# The reranker's labels of training candidates, the distilled retriever's teacher: the row's, or
# on the fit part (select/rerank) the chosen reranker point's, a distillation grid point's teacher.
rule score_candidates:
    input:
        unpack(SELECTION.teacher_inputs),
        code=stage_code("score_candidates"),
        qrels=rules.ingest.output.qrels,
        passages=rules.split_passages.output.passages,
    output:
        scores=f"{RESULTS}/{{collection}}/{{method}}/{SEED_DIR}/{{scorer}}/teacher_scores.parquet",
    log:
        f"{LOGS}/{{collection}}/{{method}}/{SEED_DIR}/{{scorer}}/score_candidates.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/{SEED_DIR}/{{scorer}}/score_candidates.tsv"
    wildcard_constraints:
        scorer=f"{RERANKER_GRID}|select/{RERANKER_GRID}",
    conda:
        "../envs/training.yaml"
    threads: 2
    resources:
        mem_mb=8000,
        runtime=120,
    params:
        split=fit_or_training_split,
        candidates=FT["distill"]["candidates"],
        max_queries=FT["distill"]["max_queries"] or 0,
        max_length=FT["reranker"]["max_length"],
        flags=FINETUNE.scoring_flags,
    shell:
        "python -m dprflow.stages.score_candidates --model {input.model:q} --negatives {input.negatives:q}"
        " --queries {input.queries:q} --qrels {input.qrels:q} --passages {input.passages:q}"
        " --out {output.scores:q} --split {params.split:q} --candidates {params.candidates:q}"
        " --max-queries {params.max_queries:q}"
        " --max-length {params.max_length:q} {params.flags} --threads {threads}"
        " > {log:q} 2>&1"
