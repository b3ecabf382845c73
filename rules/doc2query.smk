# doc2query for query-as-context pre-training: a query generator trained on the collection's
# training (query, passage) pairs (or a given seq2seq model), then C sampled queries per passage.


rule train_doc2query:
    input:
        code=stage_code("train_doc2query"),
        init=MODELS.model_init_input,
        queries=rules.ingest.output.queries,
        qrels=rules.ingest.output.qrels,
        passages=rules.split_passages.output.passages,
    output:
        model=directory(f"{RESULTS}/{{collection}}/doc2query/model"),
    log:
        f"{LOGS}/{{collection}}/train_doc2query.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/train_doc2query.tsv"
    conda:
        "../envs/training.yaml"
    threads: 2
    resources:
        mem_mb=8000,
        runtime=720,
        # how often to save, not what is trained: a resource, so changing it reruns nothing
        checkpoint_every=FT["checkpoint_every"],
        log_every=config["training"]["log_every"],
        num_workers=config["training"]["num_workers"],
    params:
        fingerprint=MODELS.model_init_fingerprint,
        launch=training_launcher,
        init=INIT,
        split=COLLECTIONS.train_split,
        flags=DOC2QUERY.train_flags,
        checkpoints=f"{RESULTS}/{{collection}}/doc2query/checkpoints",
    shell:
        "{params.launch} -m dprflow.stages.train_doc2query --init {params.init:q}"
        " --queries {input.queries:q} --qrels {input.qrels:q} --passages {input.passages:q}"
        " --split {params.split:q} --out {output.model:q} --checkpoint-dir {params.checkpoints:q}"
        " {params.flags} --checkpoint-every {resources.checkpoint_every} --log-every {resources.log_every} --num-workers {resources.num_workers} --threads {threads} > {log:q} 2>&1"


rule doc2query:
    input:
        code=stage_code("doc2query"),
        model=DOC2QUERY.model_input,
        passages=rules.split_passages.output.passages,
    output:
        queries=f"{RESULTS}/{{collection}}/doc2query/generated_queries.parquet",
    log:
        f"{LOGS}/{{collection}}/doc2query.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/doc2query.tsv"
    conda:
        "../envs/training.yaml"
    threads: 2
    resources:
        mem_mb=8000,
        runtime=720,
    params:
        fingerprint=DOC2QUERY.model_fingerprint,
        model=DOC2QUERY.model,
        flags=DOC2QUERY.generate_flags,
    shell:
        "python -m dprflow.stages.doc2query --model {params.model:q} --passages {input.passages:q}"
        " --out {output.queries:q} {params.flags} --threads {threads} > {log:q} 2>&1"
