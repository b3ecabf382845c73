# Pre-training: Condenser on the generic corpus (stage one, shared by every collection) and
# coCondenser on each collection's own documents (stage two); Contriever on each collection's
# documents; the masked auto-encoders (below). Every method reads its corpus from a token store
# (rule pretrain_tokenize): the corpus tokenized once per tokenizer and view, memory-mapped.
# Their inputs and flags: PRETRAIN (dprflow.plan.pretrain, tested in tests/test_plan_pretrain.py).


wildcard_constraints:
    view="|".join(TOKEN_VIEWS),
    tokenizer="[A-Za-z0-9._-]+",


rule pretrain_tokenize:
    input:
        code=stage_code("pretrain_tokenize"),
        tokenizer=PRETRAIN.tokenizer_input,
        corpus=PRETRAIN.corpus_texts_input,
    output:
        tokens=directory(f"{RESULTS}/{{corpus}}/tokens/{{tokenizer}}/{{view}}"),
    log:
        f"{LOGS}/{{corpus}}/tokenize_{{tokenizer}}_{{view}}.log",
    benchmark:
        f"{BENCHMARKS}/{{corpus}}/tokenize_{{tokenizer}}_{{view}}.tsv"
    conda:
        "../envs/training.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=240,
    params:
        flags=PRETRAIN.tokenize_flags,
        fingerprint=PRETRAIN.tokenizer_fingerprint,
    shell:
        "python -m dprflow.stages.pretrain_tokenize {params.flags} --view {wildcards.view:q}"
        " --out {output.tokens:q} > {log:q} 2>&1"


# The MLM base (model.init: mlm): a BERT pre-trained from random weights with BERT's masked
# language model on the generic corpus (Devlin et al. 2019, section 3.1), every method's start.


rule pretrain_mlm:
    input:
        code=stage_code("pretrain_mlm"),
        tokenizer=PRETRAIN.mlm_tokenizer_input,
        corpus=PRETRAIN.generic_corpus_input,
        tokens=PRETRAIN.mlm_tokens,
    output:
        model=directory(MLM_MODEL),
    log:
        f"{LOGS}/pretrain/pretrain_mlm.log",
    benchmark:
        f"{BENCHMARKS}/pretrain/pretrain_mlm.tsv"
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
        fingerprint=PRETRAIN.mlm_tokenizer_fingerprint,
        launch=training_launcher,
        flags=PRETRAIN.pretrain_mlm_flags,
        checkpoints=f"{RESULTS}/pretrain/mlm/checkpoints",
    shell:
        "{params.launch} -m dprflow.stages.pretrain_mlm --out {output.model:q} --tokens {input.tokens:q}"
        " --checkpoint-dir {params.checkpoints:q} {params.flags} --checkpoint-every {resources.checkpoint_every} --log-every {resources.log_every} --num-workers {resources.num_workers} --threads {threads} --mem-mb {resources.mem_mb} > {log:q} 2>&1"


rule pretrain_generic:
    input:
        code=stage_code("pretrain_generic"),
        init=MODELS.model_init_input,
        corpus=PRETRAIN.generic_corpus_input,
        tokens=PRETRAIN.condenser_tokens,
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
        # how often to save, not what is trained: a resource, so changing it reruns nothing
        checkpoint_every=FT["checkpoint_every"],
        log_every=config["training"]["log_every"],
        num_workers=config["training"]["num_workers"],
    params:
        fingerprint=MODELS.model_init_fingerprint,
        launch=training_launcher,
        init=INIT,
        flags=PRETRAIN.pretrain_generic_flags,
        checkpoints=f"{RESULTS}/pretrain/condenser/generic/checkpoints",
    shell:
        "{params.launch} -m dprflow.stages.pretrain_generic --init {params.init:q} --out {output.model:q}"
        " --tokens {input.tokens:q} --checkpoint-dir {params.checkpoints:q} {params.flags} --checkpoint-every {resources.checkpoint_every} --log-every {resources.log_every} --num-workers {resources.num_workers} --threads {threads} --mem-mb {resources.mem_mb} > {log:q} 2>&1"


rule pretrain_corpus:
    input:
        code=stage_code("pretrain_corpus"),
        init=MODELS.condenser_input,
        passages=PRETRAIN.corpus_stage_passages,
        tokens=PRETRAIN.cocondenser_tokens,
        queries=PRETRAIN.qac_queries_input,
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
        # how often to save, not what is trained: a resource, so changing it reruns nothing
        checkpoint_every=FT["checkpoint_every"],
        log_every=config["training"]["log_every"],
        num_workers=config["training"]["num_workers"],
    params:
        fingerprint=PRETRAIN.cocondenser_init_fingerprint,
        launch=training_launcher,
        init=MODELS.condenser_model(),
        flags=PRETRAIN.pretrain_corpus_flags,
        checkpoints=f"{RESULTS}/{{collection}}/{{cocondenser}}/pretrain/checkpoints",
    shell:
        "{params.launch} -m dprflow.stages.pretrain_corpus --init {params.init:q} --passages {input.passages:q}"
        " --tokens {input.tokens:q} --out {output.model:q} --checkpoint-dir {params.checkpoints:q} {params.flags}"
        " --checkpoint-every {resources.checkpoint_every} --log-every {resources.log_every} --num-workers {resources.num_workers} --threads {threads} --mem-mb {resources.mem_mb} > {log:q} 2>&1"


rule pretrain_contriever:
    input:
        code=stage_code("pretrain_contriever"),
        init=MODELS.model_init_input,
        corpus=PRETRAIN.contriever_corpus_input,
        tokens=PRETRAIN.contriever_tokens,
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
        # how often to save, not what is trained: a resource, so changing it reruns nothing
        checkpoint_every=FT["checkpoint_every"],
        log_every=config["training"]["log_every"],
        num_workers=config["training"]["num_workers"],
    params:
        fingerprint=MODELS.model_init_fingerprint,
        launch=training_launcher,
        init=INIT,
        flags=PRETRAIN.pretrain_contriever_flags,
        checkpoints=f"{RESULTS}/{{collection}}/contriever/pretrain/checkpoints",
    shell:
        "{params.launch} -m dprflow.stages.pretrain_contriever --init {params.init:q}"
        " --tokens {input.tokens:q} --out {output.model:q} --checkpoint-dir {params.checkpoints:q}"
        " {params.flags} --checkpoint-every {resources.checkpoint_every} --log-every {resources.log_every} --num-workers {resources.num_workers} --threads {threads} --mem-mb {resources.mem_mb} > {log:q} 2>&1"


# Method mlm: the initial model's masked language model continued on each collection's own
# documents (domain-adaptive pre-training, Gururangan et al. 2020), the control of the
# corpus-aware methods: the same text, BERT's objective. The same module as the MLM base.


rule pretrain_mlm_corpus:
    input:
        code=stage_code("pretrain_mlm"),
        init=MODELS.model_init_input,
        passages=PRETRAIN.mlm_corpus_passages,
        tokens=PRETRAIN.mlm_corpus_tokens,
    output:
        model=directory(f"{RESULTS}/{{collection}}/mlm/pretrain/model"),
    log:
        f"{LOGS}/{{collection}}/mlm/pretrain_mlm_corpus.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/mlm/pretrain_mlm_corpus.tsv"
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
        flags=PRETRAIN.pretrain_mlm_corpus_flags,
        checkpoints=f"{RESULTS}/{{collection}}/mlm/pretrain/checkpoints",
    shell:
        "{params.launch} -m dprflow.stages.pretrain_mlm --init {params.init:q} --tokens {input.tokens:q}"
        " --out {output.model:q} --checkpoint-dir {params.checkpoints:q} {params.flags}"
        " --checkpoint-every {resources.checkpoint_every} --log-every {resources.log_every} --num-workers {resources.num_workers} --threads {threads} --mem-mb {resources.mem_mb} > {log:q} 2>&1"


# Masked auto-encoders (BMAE, CDMAE, CoT-MAE): n-gram statistics for CDMAE's importance-aware
# masking, then generic pre-training and corpus-aware pre-training (CDMAE Table 5). The two
# pre-training rules run one module, dprflow.stages.pretrain_mae.


rule pmi_count:
    input:
        code=stage_code("pmi_count"),
        corpus=PRETRAIN.corpus_texts_input,
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
        mem_mb=PRETRAIN.pmi_count_mem_mb,
        runtime=120,
    params:
        flags=PRETRAIN.pmi_count_flags,
    shell:
        "python -m dprflow.stages.pmi_count {params.flags} --shard {wildcards.shard:q}"
        " --out {output.counts:q} > {log:q} 2>&1"


rule pmi:
    input:
        code=stage_code("pmi"),
        counts=PRETRAIN.pmi_shard_files,
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
        "python -m dprflow.stages.pmi --counts {input.counts:q} --min-count {params.min_count:q}"
        " --out {output.stats:q} > {log:q} 2>&1"


rule pretrain_mae_generic:
    input:
        code=stage_code("pretrain_mae"),
        init=MODELS.model_init_input,
        corpus=PRETRAIN.generic_corpus_input,
        pmi=PRETRAIN.mae_generic_pmi,
        tokens=PRETRAIN.mae_generic_tokens,
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
        # how often to save, not what is trained: a resource, so changing it reruns nothing
        checkpoint_every=FT["checkpoint_every"],
        log_every=config["training"]["log_every"],
        num_workers=config["training"]["num_workers"],
    params:
        fingerprint=MODELS.model_init_fingerprint,
        launch=training_launcher,
        init=INIT,
        flags=PRETRAIN.mae_generic_flags,
        checkpoints=f"{RESULTS}/pretrain/{{mae}}/generic/checkpoints",
    shell:
        "{params.launch} -m dprflow.stages.pretrain_mae --variant {wildcards.mae:q} --init {params.init:q}"
        " --out {output.model:q} --checkpoint-dir {params.checkpoints:q} {params.flags}"
        " --checkpoint-every {resources.checkpoint_every} --log-every {resources.log_every} --num-workers {resources.num_workers} --threads {threads} --mem-mb {resources.mem_mb} > {log:q} 2>&1"


rule pretrain_mae_corpus:
    input:
        code=stage_code("pretrain_mae"),
        init=PRETRAIN.mae_generic_model,
        passages=PRETRAIN.corpus_stage_passages,
        pmi=PRETRAIN.mae_corpus_pmi,
        tokens=PRETRAIN.mae_corpus_tokens,
        queries=PRETRAIN.qac_queries_input,
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
        # how often to save, not what is trained: a resource, so changing it reruns nothing
        checkpoint_every=FT["checkpoint_every"],
        log_every=config["training"]["log_every"],
        num_workers=config["training"]["num_workers"],
    params:
        launch=training_launcher,
        variant=PRETRAIN.mae_variant,
        init=PRETRAIN.mae_corpus_init,
        flags=PRETRAIN.mae_corpus_flags,
        checkpoints=f"{RESULTS}/{{collection}}/{{mae_method}}/pretrain/checkpoints",
    shell:
        "{params.launch} -m dprflow.stages.pretrain_mae --variant {params.variant:q} --init {params.init:q}"
        " --corpus passages --corpus-path {input.passages:q} --out {output.model:q}"
        " --checkpoint-dir {params.checkpoints:q} {params.flags} --checkpoint-every {resources.checkpoint_every} --log-every {resources.log_every} --num-workers {resources.num_workers} --threads {threads} --mem-mb {resources.mem_mb} > {log:q} 2>&1"
