# Bi-encoder retrievers: training (retriever 1, retriever 2, distilled), corpus encoding in
# shards, exact search, hard-negative mining, and neighbourhood recall between retrievers 1 and 2.
# Fine-tuned outputs live in results/<collection>/<method>/seed-<seed>/ (one per config seed);
# the off-the-shelf encoders in results/<collection>/<method>/zeroshot/ (model.references: method
# ref-<name>). A row scored on another collection than its own (transfer evaluation) encodes and
# searches that collection in <row>/on-<collection>/ (search_eval).


rule train_retriever:
    input:
        unpack(FINETUNE.retriever_inputs),
        code=stage_code("train_retriever"),
        queries=SELECTION.training_queries,
        selection=SELECTION.selection_file,
        qrels=rules.ingest.output.qrels,
        passages=rules.split_passages.output.passages,
    output:
        model=directory(
            f"{RESULTS}/{{collection}}/{{method}}/{SEED_DIR}/{{trained}}/model"
        ),
    log:
        f"{LOGS}/{{collection}}/{{method}}/{SEED_DIR}/train_retriever_{{trained}}.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/{SEED_DIR}/train_retriever_{{trained}}.tsv"
    # on the longest chain (negatives, trainings): ahead of other ready jobs, e.g. zero-shot encoding
    priority: 1
    conda:
        "../envs/training.yaml"
    threads: 2
    resources:
        mem_mb=FINETUNE.train_retriever_mem_mb,
        runtime=FINETUNE.train_retriever_runtime,
        # how often to save, not what is trained: a resource, so changing it reruns nothing
        checkpoint_every=FT["checkpoint_every"],
        log_every=config["training"]["log_every"],
        num_workers=config["training"]["num_workers"],
    params:
        fingerprint=MODELS.init_fingerprint,
        launch=training_launcher,
        init=MODELS.method_init,
        split=fit_or_training_split,
        flags=FINETUNE.retriever_flags,
        checkpoints=f"{RESULTS}/{{collection}}/{{method}}/{SEED_DIR}/{{trained}}/checkpoints",
    shell:
        "{params.launch} -m dprflow.stages.train_retriever --init {params.init:q} --queries {input.queries:q}"
        " --qrels {input.qrels:q} --passages {input.passages:q} --negatives {input.negatives:q}"
        " --split {params.split:q} --out {output.model:q} --checkpoint-dir {params.checkpoints:q}"
        " {params.flags} --checkpoint-every {resources.checkpoint_every} --log-every {resources.log_every} --num-workers {resources.num_workers} --mem-mb {resources.mem_mb}"
        " --threads {threads} > {log:q} 2>&1"


rule encode_corpus:
    input:
        code=stage_code("encode_corpus"),
        passages=COLLECTIONS.of_scored_collection(rules.split_passages.output.passages),
        model=FINETUNE.encoder_inputs,
    output:
        embeddings=embeddings_output(),
    log:
        f"{LOGS}/{{collection}}/{{method}}/{{retriever}}/encode_corpus_{{shard}}.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/{{retriever}}/encode_corpus_{{shard}}.tsv"
    conda:
        "../envs/training.yaml"
    threads: 2
    resources:
        mem_mb=RESOURCES.encode_mem_mb,
        runtime=RESOURCES.encode_runtime,
    params:
        fingerprint=MODELS.init_fingerprint,
        flags=FINETUNE.encoder_flags,
        num_shards=FT["encode_shards"],
        max_length=FT["max_passage_length"],
        batch_size=FT["encode_batch_size"],
    shell:
        "python -m dprflow.stages.encode_corpus {params.flags} --passages {input.passages:q}"
        " --out {output.embeddings:q} --shard {wildcards.shard:q} --num-shards {params.num_shards:q}"
        " --max-length {params.max_length:q} --batch-size {params.batch_size:q} --threads {threads}"
        " > {log:q} 2>&1"


rule search_dense:
    input:
        code=stage_code("search_dense"),
        embeddings=FINETUNE.embedding_shards,
        queries=rules.ingest.output.queries,
        model=FINETUNE.encoder_inputs,
    output:
        run=f"{RESULTS}/{{collection}}/{{method}}/{{retriever}}/run.parquet",
        trec=f"{RESULTS}/{{collection}}/{{method}}/{{retriever}}/run.trec",
        encoder=f"{RESULTS}/{{collection}}/{{method}}/{{retriever}}/encoder.json",
        train_run=f"{RESULTS}/{{collection}}/{{method}}/{{retriever}}/train_run.parquet",
    log:
        f"{LOGS}/{{collection}}/{{method}}/{{retriever}}/search_dense.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/{{retriever}}/search_dense.tsv"
    # a fine-tuned retriever on its own collection: the evaluation and the training queries
    wildcard_constraints:
        retriever=TRAINED_RETRIEVER,
    conda:
        "../envs/training.yaml"
    threads: 2
    resources:
        mem_mb=RESOURCES.search_mem_mb,
        runtime=RESOURCES.search_runtime,
    params:
        fingerprint=MODELS.init_fingerprint,
        flags=FINETUNE.search_flags,
        eval_split=COLLECTIONS.eval_split,
        train_split=COLLECTIONS.train_split,
        depth=FT["search_depth"],
        train_depth=FINETUNE.train_depth(),
        max_length=FT["max_query_length"],
        tag=run_tag,
    shell:
        "python -m dprflow.stages.search_dense {params.flags} --embeddings {input.embeddings:q}"
        " --queries {input.queries:q} --out {output.run:q} --trec {output.trec:q} --encoder-out {output.encoder:q}"
        " --train-out {output.train_run:q} --eval-split {params.eval_split:q}"
        " --train-split {params.train_split:q} --depth {params.depth:q}"
        " --train-depth {params.train_depth:q} --max-length {params.max_length:q}"
        " --tag {params.tag:q} --threads {threads} > {log:q} 2>&1"


# A row that needs no training run: an off-the-shelf (zeroshot) row, or a row scored on another
# collection than the one it was trained on (transfer); only the evaluation queries are searched.
rule search_eval:
    input:
        code=stage_code("search_dense"),
        embeddings=FINETUNE.embedding_shards,
        queries=COLLECTIONS.of_scored_collection(rules.ingest.output.queries),
        model=FINETUNE.encoder_inputs,
    output:
        run=f"{RESULTS}/{{collection}}/{{method}}/{{retriever}}/run.parquet",
        trec=f"{RESULTS}/{{collection}}/{{method}}/{{retriever}}/run.trec",
        encoder=f"{RESULTS}/{{collection}}/{{method}}/{{retriever}}/encoder.json",
    log:
        f"{LOGS}/{{collection}}/{{method}}/{{retriever}}/search_dense.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/{{retriever}}/search_dense.tsv"
    wildcard_constraints:
        retriever=EVAL_ONLY_RETRIEVER,
    conda:
        "../envs/training.yaml"
    threads: 2
    resources:
        mem_mb=RESOURCES.search_mem_mb,
        runtime=RESOURCES.search_runtime,
    params:
        fingerprint=MODELS.init_fingerprint,
        flags=FINETUNE.search_flags,
        eval_split=COLLECTIONS.scored_eval_split,
        depth=FT["search_depth"],
        max_length=FT["max_query_length"],
        tag=run_tag,
    shell:
        "python -m dprflow.stages.search_dense {params.flags} --embeddings {input.embeddings:q}"
        " --queries {input.queries:q} --out {output.run:q} --trec {output.trec:q}"
        " --encoder-out {output.encoder:q} --eval-split {params.eval_split:q} --depth {params.depth:q}"
        " --max-length {params.max_length:q} --tag {params.tag:q} --threads {threads:q} > {log:q} 2>&1"


rule export_faiss:
    input:
        code=stage_code("export_faiss"),
        embeddings=FINETUNE.embedding_shards,
        encoder=rules.search_dense.output.encoder,
    output:
        index=directory(f"{RESULTS}/{{collection}}/{{method}}/{{retriever}}/faiss"),
    log:
        f"{LOGS}/{{collection}}/{{method}}/{{retriever}}/export_faiss.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/{{retriever}}/export_faiss.tsv"
    conda:
        "../envs/training.yaml"
    threads: 1
    resources:
        mem_mb=RESOURCES.search_mem_mb,
        runtime=RESOURCES.search_runtime,
    params:
        max_query_length=FT["max_query_length"],
    shell:
        "python -m dprflow.stages.export_faiss --embeddings {input.embeddings:q}"
        " --encoder {input.encoder:q} --max-query-length {params.max_query_length:q}"
        " --out {output.index:q} > {log:q} 2>&1"


rule mine_negatives:
    input:
        code=stage_code("mine_negatives"),
        run=SELECTION.mined_runs,
        selection=SELECTION.mining_selection,
        qrels=rules.ingest.output.qrels,
        passages=rules.split_passages.output.passages,
    output:
        negatives=f"{RESULTS}/{{collection}}/{{method}}/{SEED_DIR}/{{trained}}/negatives.parquet",
    log:
        f"{LOGS}/{{collection}}/{{method}}/{SEED_DIR}/mine_negatives_{{trained}}.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/{SEED_DIR}/mine_negatives_{{trained}}.tsv"
    # r1's pool (K2) for r2, r2's (K3) for the reranker, or the fit part's (select) for the
    # negatives' grid, from the chosen retriever point's fit run
    wildcard_constraints:
        trained="r1|r2|select",
    conda:
        "../envs/evaluation.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        depth=FINETUNE.mining_depth,
        flags=SELECTION.mining_flags,
    shell:
        "python -m dprflow.stages.mine_negatives --run {input.run:q} --qrels {input.qrels:q}"
        " --passages {input.passages:q} --out {output.negatives:q} --depth {params.depth:q}{params.flags}"
        " > {log:q} 2>&1"


rule nb_recall:
    input:
        code=stage_code("nb_recall"),
        run_r1=f"{RESULTS}/{{collection}}/{{method}}/{SEED_DIR}/r1/run.parquet",
        run_r2=f"{RESULTS}/{{collection}}/{{method}}/{SEED_DIR}/r2/run.parquet",
    output:
        table=f"{RESULTS}/{{collection}}/{{method}}/{SEED_DIR}/nb_recall.parquet",
    log:
        f"{LOGS}/{{collection}}/{{method}}/{SEED_DIR}/nb_recall.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/{SEED_DIR}/nb_recall.tsv"
    conda:
        "../envs/evaluation.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        n=FT["nb_recall_n"],
        k=FT["nb_recall_k"],
    shell:
        "python -m dprflow.stages.nb_recall --run-r1 {input.run_r1:q} --run-r2 {input.run_r2:q}"
        " --out {output.table:q} --n {params.n:q} --k {params.k:q} > {log:q} 2>&1"
