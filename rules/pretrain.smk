# Pre-training: Condenser on the generic corpus (stage one, shared by every collection) and
# coCondenser on each collection's own documents (stage two).


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
        init=config["model"]["init"],
        flags=pretrain_generic_flags,
        checkpoints=f"{RESULTS}/pretrain/condenser/generic/checkpoints",
    shell:
        "python -m dprflow.stages.pretrain_generic --init {params.init} --out {output.model}"
        " --checkpoint-dir {params.checkpoints} {params.flags} --threads {threads} > {log} 2>&1"


rule pretrain_corpus:
    input:
        code=stage_code("pretrain_corpus"),
        init=rules.pretrain_generic.output.model,
        passages=rules.split_passages.output.passages,
    output:
        model=directory(f"{RESULTS}/{{collection}}/cocondenser/pretrain/model"),
    log:
        f"{LOGS}/{{collection}}/cocondenser/pretrain_corpus.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/cocondenser/pretrain_corpus.tsv"
    conda:
        "../envs/training.yaml"
    threads: 2
    resources:
        mem_mb=8000,
        runtime=720,
    params:
        flags=pretrain_corpus_flags,
        checkpoints=f"{RESULTS}/{{collection}}/cocondenser/pretrain/checkpoints",
    shell:
        "python -m dprflow.stages.pretrain_corpus --init {input.init} --passages {input.passages}"
        " --out {output.model} --checkpoint-dir {params.checkpoints} {params.flags}"
        " --threads {threads} > {log} 2>&1"
