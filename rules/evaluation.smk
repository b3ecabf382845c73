# Evaluation: per-query metrics of every run, then one comparison table over all of them. A row
# scored on another collection than its own (<row>/on-<target>, dprflow.plan.rows.transfer) is scored on
# the target's queries and qrels.


rule evaluate:
    input:
        code=stage_code("evaluate"),
        run=f"{RESULTS}/{{collection}}/{{system}}/run.parquet",
        passages=COLLECTIONS.of_scored_collection(rules.split_passages.output.passages),
        queries=COLLECTIONS.of_scored_collection(rules.ingest.output.queries),
        qrels=COLLECTIONS.of_scored_collection(rules.ingest.output.qrels),
    output:
        metrics=f"{RESULTS}/{{collection}}/{{system}}/metrics.parquet",
        doc_run=f"{RESULTS}/{{collection}}/{{system}}/run.doc.trec",
    log:
        f"{LOGS}/{{collection}}/evaluate/{{system}}.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/evaluate/{{system}}.tsv"
    conda:
        "../envs/evaluation.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        split=COLLECTIONS.scored_eval_split,
        metrics=config["evaluation"]["metrics"],
    shell:
        "python -m dprflow.stages.evaluate --run {input.run:q} --passages {input.passages:q}"
        " --queries {input.queries:q} --qrels {input.qrels:q} --split {params.split:q}"
        " --out {output.metrics:q} --doc-run {output.doc_run:q} --metrics {params.metrics:q} > {log:q} 2>&1"


rule compare:
    input:
        code=stage_code("compare"),
        metrics=REPORT.metrics_files(),
        encoders=REPORT.encoder_files(),
        selections=SELECTION.selection_files(),
    output:
        md=f"{RESULTS}/compare.md",
        csv=f"{RESULTS}/compare.csv",
    log:
        f"{LOGS}/compare.log",
    benchmark:
        f"{BENCHMARKS}/compare.tsv"
    conda:
        "../envs/evaluation.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        metrics=config["evaluation"]["metrics"],
        methods=REPORT.row_order(),
        baseline=config["evaluation"]["baseline"],
        also_against=config["evaluation"]["also_against"],
        results=compare_results_dir,
        paper_references=COLLECTIONS.paper_references(),
        splits=COLLECTIONS.scored_splits(),
        trained_on=COLLECTIONS.trained_on_collections(),
        significance=config["evaluation"]["significance"],
        permutations=config["evaluation"]["permutations"],
        permutation_seed=config["evaluation"]["permutation_seed"],
        untrained=ROWS.untrained(),
    shell:
        "python -m dprflow.stages.compare --metrics-files {input.metrics:q} --results-dir {params.results:q}"
        " --encoder-files {input.encoders:q} --selection-files {input.selections:q} --out-md {output.md:q} --out-csv {output.csv:q}"
        " --metrics {params.metrics:q}"
        " --methods {params.methods:q} --baseline {params.baseline:q}"
        " --also-against {params.also_against:q}"
        " --significance {params.significance:q} --permutations {params.permutations:q}"
        " --permutation-seed {params.permutation_seed:q}"
        " --splits {params.splits:q} --trained-on {params.trained_on:q}"
        " --untrained-rows {params.untrained:q}"
        " --paper-references {params.paper_references:q} > {log:q} 2>&1"


rule export_model:
    input:
        code=stage_code("export_model"),
        model=f"{RESULTS}/{{collection}}/{{method}}/{SEED_DIR}/{{stage}}/model",
        compare=rules.compare.output.csv,
    output:
        hub=directory(f"{RESULTS}/{{collection}}/{{method}}/{SEED_DIR}/{{stage}}/hub"),
    log:
        f"{LOGS}/{{collection}}/{{method}}/{SEED_DIR}/export_model_{{stage}}.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/{SEED_DIR}/export_model_{{stage}}.tsv"
    wildcard_constraints:
        stage="|".join(STAGES),
    conda:
        "../envs/evaluation.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    shell:
        "python -m dprflow.stages.export_model --model {input.model:q} --compare-csv {input.compare:q}"
        " --collection {wildcards.collection:q} --out {output.hub:q} > {log:q} 2>&1"
