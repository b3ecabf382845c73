# Collections: ingest a named collection, then cut its documents into passages.


rule ingest:
    input:
        code=stage_code("ingest"),
        source=COLLECTIONS.ingest_inputs,
    output:
        documents=f"{RESULTS}/{{collection}}/collection/documents.parquet",
        queries=f"{RESULTS}/{{collection}}/collection/queries.parquet",
        qrels=f"{RESULTS}/{{collection}}/collection/qrels.parquet",
    log:
        f"{LOGS}/{{collection}}/ingest.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/ingest.tsv"
    conda:
        "../envs/collections.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        flags=COLLECTIONS.ingest_flags,
        out_dir=COLLECTIONS.ingest_out_dir,
    shell:
        "python -m dprflow.stages.ingest {params.flags} --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule trec_qrels:
    input:
        code=stage_code("trec_qrels"),
        queries=rules.ingest.output.queries,
        qrels=rules.ingest.output.qrels,
    output:
        trec=f"{RESULTS}/{{collection}}/collection/qrels.{{split}}.trec",
    log:
        f"{LOGS}/{{collection}}/trec_qrels/{{split}}.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/trec_qrels/{{split}}.tsv"
    wildcard_constraints:
        split="[A-Za-z0-9_-]+",
    conda:
        "../envs/evaluation.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    shell:
        "python -m dprflow.stages.trec_qrels --queries {input.queries:q} --qrels {input.qrels:q}"
        " --split {wildcards.split:q} --out {output.trec:q} > {log:q} 2>&1"


rule split_passages:
    input:
        code=stage_code("split_passages"),
        documents=rules.ingest.output.documents,
        model=MODELS.tokenizer_init_input,
    output:
        passages=f"{RESULTS}/{{collection}}/passages.parquet",
    log:
        f"{LOGS}/{{collection}}/split_passages.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/split_passages.tsv"
    conda:
        "../envs/collections.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        fingerprint=MODELS.tokenizer_init_fingerprint,
        model=INIT_TOKENIZER,
        max_tokens=config["passages"]["max_tokens"],
    shell:
        "python -m dprflow.stages.split_passages --documents {input.documents:q} --out {output.passages:q}"
        " --model {params.model:q} --max-tokens {params.max_tokens:q} > {log:q} 2>&1"
