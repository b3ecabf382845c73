# Pre-training: Condenser on the generic corpus (stage one, shared by every collection) and
# coCondenser on each collection's own documents (stage two); Contriever on each collection's
# documents; the masked auto-encoders (below).


rule pretrain_generic:
    input:
        code=stage_code("pretrain_generic"),
        corpus=generic_corpus_input,
    output:
        model=directory(f"{RESULTS}/pretrain/condenser/generic/model"),
    log:
        f"{LOGS}/pretrain/pretrain_generic_condenser.log",
    benchmark:
        f"{BENCHMARKS}/pretrain/pretrain_generic_condenser.tsv"
    conda:
        "../envs/training.yaml"
    threads: 2
    resources:
        mem_mb=8000,
        runtime=720,
    params:
        launch=training_launcher,
        init=config["model"]["init"],
        flags=pretrain_generic_flags,
        checkpoints=f"{RESULTS}/pretrain/condenser/generic/checkpoints",
    shell:
        "{params.launch} -m dprflow.stages.pretrain_generic --init {params.init} --out {output.model}"
        " --checkpoint-dir {params.checkpoints} {params.flags} --threads {threads} > {log} 2>&1"


rule pretrain_corpus:
    input:
        code=stage_code("pretrain_corpus"),
        init=rules.pretrain_generic.output.model,
        passages=rules.split_passages.output.passages,
        queries=qac_queries_input,
    output:
        model=directory(f"{RESULTS}/{{collection}}/{{cocondenser}}/pretrain/model"),
    log:
        f"{LOGS}/{{collection}}/{{cocondenser}}/pretrain_corpus.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{cocondenser}}/pretrain_corpus.tsv"
    conda:
        "../envs/training.yaml"
    threads: 2
    resources:
        mem_mb=8000,
        runtime=720,
    params:
        launch=training_launcher,
        flags=pretrain_corpus_flags,
        checkpoints=f"{RESULTS}/{{collection}}/{{cocondenser}}/pretrain/checkpoints",
    shell:
        "{params.launch} -m dprflow.stages.pretrain_corpus --init {input.init} --passages {input.passages}"
        " --out {output.model} --checkpoint-dir {params.checkpoints} {params.flags}"
        " --threads {threads} > {log} 2>&1"


rule pretrain_contriever:
    input:
        code=stage_code("pretrain_contriever"),
        passages=rules.split_passages.output.passages,
    output:
        model=directory(f"{RESULTS}/{{collection}}/contriever/pretrain/model"),
    log:
        f"{LOGS}/{{collection}}/contriever/pretrain_contriever.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/contriever/pretrain_contriever.tsv"
    conda:
        "../envs/training.yaml"
    threads: 2
    resources:
        mem_mb=8000,
        runtime=720,
    params:
        launch=training_launcher,
        init=config["model"]["init"],
        flags=pretrain_contriever_flags,
        checkpoints=f"{RESULTS}/{{collection}}/contriever/pretrain/checkpoints",
    shell:
        "{params.launch} -m dprflow.stages.pretrain_contriever --init {params.init}"
        " --passages {input.passages} --out {output.model} --checkpoint-dir {params.checkpoints}"
        " {params.flags} --threads {threads} > {log} 2>&1"


# Masked auto-encoders (BMAE, CDMAE, CoT-MAE): n-gram statistics for CDMAE's importance-aware
# masking, then generic pre-training and corpus-aware pre-training (CDMAE Table 5). The two
# pre-training rules run one module, dprflow.stages.pretrain_mae.


rule pmi_count:
    input:
        code=stage_code("pmi_count"),
        corpus=pmi_corpus_input,
    output:
        counts=temp(f"{RESULTS}/{{corpus}}/pmi/counts/{{shard}}.parquet"),
    log:
        f"{LOGS}/{{corpus}}/pmi_count_{{shard}}.log",
    benchmark:
        f"{BENCHMARKS}/{{corpus}}/pmi_count_{{shard}}.tsv"
    conda:
        "../envs/collections.yaml"
    threads: 1
    resources:
        mem_mb=pmi_count_mem_mb,
        runtime=120,
    params:
        flags=pmi_count_flags,
    shell:
        "python -m dprflow.stages.pmi_count {params.flags} --shard {wildcards.shard}"
        " --out {output.counts} > {log} 2>&1"


rule pmi:
    input:
        code=stage_code("pmi"),
        counts=pmi_shard_files,
    output:
        stats=f"{RESULTS}/{{corpus}}/pmi/ngram_counts.parquet",
    log:
        f"{LOGS}/{{corpus}}/pmi.log",
    benchmark:
        f"{BENCHMARKS}/{{corpus}}/pmi.tsv"
    conda:
        "../envs/collections.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=120,
    params:
        min_count=PT["pmi"]["min_count"],
    shell:
        "python -m dprflow.stages.pmi --counts {input.counts} --min-count {params.min_count}"
        " --out {output.stats} > {log} 2>&1"


rule pretrain_mae_generic:
    input:
        code=stage_code("pretrain_mae"),
        corpus=generic_corpus_input,
        pmi=mae_generic_pmi,
    output:
        model=directory(f"{RESULTS}/pretrain/{{mae}}/generic/model"),
    log:
        f"{LOGS}/pretrain/pretrain_generic_{{mae}}.log",
    benchmark:
        f"{BENCHMARKS}/pretrain/pretrain_generic_{{mae}}.tsv"
    conda:
        "../envs/training.yaml"
    threads: 2
    resources:
        mem_mb=8000,
        runtime=720,
    params:
        launch=training_launcher,
        init=config["model"]["init"],
        flags=mae_generic_flags,
        checkpoints=f"{RESULTS}/pretrain/{{mae}}/generic/checkpoints",
    shell:
        "{params.launch} -m dprflow.stages.pretrain_mae --variant {wildcards.mae} --init {params.init}"
        " --out {output.model} --checkpoint-dir {params.checkpoints} {params.flags}"
        " --threads {threads} > {log} 2>&1"


rule pretrain_mae_corpus:
    input:
        code=stage_code("pretrain_mae"),
        init=mae_generic_model,
        passages=rules.split_passages.output.passages,
        pmi=mae_corpus_pmi,
        queries=qac_queries_input,
    output:
        model=directory(f"{RESULTS}/{{collection}}/{{mae_method}}/pretrain/model"),
    log:
        f"{LOGS}/{{collection}}/{{mae_method}}/pretrain_corpus.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{mae_method}}/pretrain_corpus.tsv"
    conda:
        "../envs/training.yaml"
    threads: 2
    resources:
        mem_mb=8000,
        runtime=720,
    params:
        launch=training_launcher,
        variant=mae_variant,
        flags=mae_corpus_flags,
        checkpoints=f"{RESULTS}/{{collection}}/{{mae_method}}/pretrain/checkpoints",
    shell:
        "{params.launch} -m dprflow.stages.pretrain_mae --variant {params.variant} --init {input.init}"
        " --corpus passages --corpus-path {input.passages} --out {output.model}"
        " --checkpoint-dir {params.checkpoints} {params.flags} --threads {threads} > {log} 2>&1"
