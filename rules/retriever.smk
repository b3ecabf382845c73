# Bi-encoder retrievers: training (retriever 1, retriever 2, distilled), corpus encoding in
# shards, exact search, hard-negative mining, and neighbourhood recall between retrievers 1 and 2.
# Fine-tuned outputs live in results/<collection>/<method>/seed-<seed>/ (one per config seed);
# the off-the-shelf encoders in results/<collection>/<method>/zeroshot/.


rule train_retriever:
    input:
        unpack(retriever_inputs),
        code=stage_code("train_retriever"),
        queries=rules.ingest.output.queries,
        qrels=rules.ingest.output.qrels,
        passages=rules.split_passages.output.passages,
    output:
        model=directory(
            f"{RESULTS}/{{collection}}/{{method}}/seed-{{seed}}/{{trained}}/model"
        ),
    log:
        f"{LOGS}/{{collection}}/{{method}}/seed-{{seed}}/train_retriever_{{trained}}.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/seed-{{seed}}/train_retriever_{{trained}}.tsv"
    conda:
        "../envs/training.yaml"
    threads: 2
    resources:
        mem_mb=train_retriever_mem_mb,
        runtime=train_retriever_runtime,
    params:
        launch=training_launcher,
        init=method_init,
        split=train_split,
        flags=retriever_flags,
        checkpoints=f"{RESULTS}/{{collection}}/{{method}}/seed-{{seed}}/{{trained}}/checkpoints",
    shell:
        "{params.launch} -m dprflow.stages.train_retriever --init {params.init} --queries {input.queries}"
        " --qrels {input.qrels} --passages {input.passages} --negatives {input.negatives}"
        " --split {params.split} --out {output.model} --checkpoint-dir {params.checkpoints}"
        " {params.flags} --threads {threads} > {log} 2>&1"


rule encode_corpus:
    input:
        code=stage_code("encode_corpus"),
        passages=rules.split_passages.output.passages,
        model=encoder_inputs,
    output:
        embeddings=f"{RESULTS}/{{collection}}/{{method}}/{{retriever}}/embeddings/shard_{{shard}}.parquet",
    log:
        f"{LOGS}/{{collection}}/{{method}}/{{retriever}}/encode_corpus_{{shard}}.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/{{retriever}}/encode_corpus_{{shard}}.tsv"
    conda:
        "../envs/training.yaml"
    threads: 2
    resources:
        mem_mb=encode_mem_mb,
        runtime=encode_runtime,
    params:
        encoder=encoder_flags,
        num_shards=FT["encode_shards"],
        max_length=FT["max_passage_length"],
        batch_size=FT["encode_batch_size"],
    shell:
        "python -m dprflow.stages.encode_corpus {params.encoder} --passages {input.passages}"
        " --out {output.embeddings} --shard {wildcards.shard} --num-shards {params.num_shards}"
        " --max-length {params.max_length} --batch-size {params.batch_size} --threads {threads}"
        " > {log} 2>&1"


rule search_dense:
    input:
        code=stage_code("search_dense"),
        embeddings=embedding_shards,
        queries=rules.ingest.output.queries,
        model=encoder_inputs,
    output:
        run=f"{RESULTS}/{{collection}}/{{method}}/{{retriever}}/run.parquet",
        trec=f"{RESULTS}/{{collection}}/{{method}}/{{retriever}}/run.trec",
        train_run=f"{RESULTS}/{{collection}}/{{method}}/{{retriever}}/train_run.parquet",
    log:
        f"{LOGS}/{{collection}}/{{method}}/{{retriever}}/search_dense.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/{{retriever}}/search_dense.tsv"
    conda:
        "../envs/training.yaml"
    threads: 2
    resources:
        mem_mb=search_mem_mb,
        runtime=search_runtime,
    params:
        encoder=encoder_flags,
        eval_split=eval_split,
        train_split=train_split,
        depth=FT["search_depth"],
        train_depth=train_depth(),
        max_length=FT["max_query_length"],
        tag=run_tag,
    shell:
        "python -m dprflow.stages.search_dense {params.encoder} --embeddings {input.embeddings}"
        " --queries {input.queries} --out {output.run} --trec {output.trec}"
        " --train-out {output.train_run} --eval-split {params.eval_split}"
        " --train-split {params.train_split} --depth {params.depth}"
        " --train-depth {params.train_depth} --max-length {params.max_length}"
        " --tag {params.tag} --threads {threads} > {log} 2>&1"


rule mine_negatives:
    input:
        code=stage_code("mine_negatives"),
        run=f"{RESULTS}/{{collection}}/{{method}}/seed-{{seed}}/{{trained}}/train_run.parquet",
        qrels=rules.ingest.output.qrels,
        passages=rules.split_passages.output.passages,
    output:
        negatives=f"{RESULTS}/{{collection}}/{{method}}/seed-{{seed}}/{{trained}}/negatives.parquet",
    log:
        f"{LOGS}/{{collection}}/{{method}}/seed-{{seed}}/mine_negatives_{{trained}}.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/seed-{{seed}}/mine_negatives_{{trained}}.tsv"
    conda:
        "../envs/evaluation.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        depth=mining_depth,
    shell:
        "python -m dprflow.stages.mine_negatives --run {input.run} --qrels {input.qrels}"
        " --passages {input.passages} --out {output.negatives} --depth {params.depth} > {log} 2>&1"


rule nb_recall:
    input:
        code=stage_code("nb_recall"),
        run_r1=f"{RESULTS}/{{collection}}/{{method}}/seed-{{seed}}/r1/run.parquet",
        run_r2=f"{RESULTS}/{{collection}}/{{method}}/seed-{{seed}}/r2/run.parquet",
    output:
        table=f"{RESULTS}/{{collection}}/{{method}}/seed-{{seed}}/nb_recall.parquet",
    log:
        f"{LOGS}/{{collection}}/{{method}}/seed-{{seed}}/nb_recall.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/seed-{{seed}}/nb_recall.tsv"
    conda:
        "../envs/evaluation.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        n=" ".join(map(str, FT["nb_recall_n"])),
        k=" ".join(map(str, FT["nb_recall_k"])),
    shell:
        "python -m dprflow.stages.nb_recall --run-r1 {input.run_r1} --run-r2 {input.run_r2}"
        " --out {output.table} --n {params.n} --k {params.k} > {log} 2>&1"
