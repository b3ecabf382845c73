# Evaluation: per-query metrics of every run, then one comparison table over all of them. A row
# scored on another collection than its own (<row>/on-<target>, rules/transfer.smk) is scored on
# the target's queries and qrels.


def compare_results_dir(wildcards, output):
    """The results folder the compared metrics files are relative to (where compare.md goes)."""
    return os.path.dirname(output.md)


def paper_references():
    """collection=reference pairs for the comparison's table beside the papers."""
    pairs = [
        f"{c}={spec['reference']}"
        for c, spec in config["collections"].items()
        if spec["reference"]
    ]
    return pairs


def scored_splits():
    """collection=split pairs: the query split each collection's comparison scores."""
    return [f"{c}={spec['eval_split']}" for c, spec in config["collections"].items()]


def trained_on_collections():
    """Collections whose scored split is their training split (score_training_queries)."""
    return [
        c
        for c in training_collections()
        if config["collections"][c]["eval_split"] == config["collections"][c]["train_split"]
    ]


def trec_qrels_files():
    """Each collection's qrels of its scored split as a TREC file, beside the rows' run.doc.trec."""
    return [
        f"{RESULTS}/{c}/collection/qrels.{spec['eval_split']}.trec"
        for c, spec in config["collections"].items()
    ]


def hub_folders():
    """The upload-ready folder of every trained model of every row (export_model)."""
    return [
        f"{RESULTS}/{c}/{m}/seed-{seed}/{stage}/hub"
        for c in training_collections()
        for m in config["methods"]
        for seed in finetune_seeds()
        for stage in method_stages(m)
    ]


def metrics_files():
    return [f"{RESULTS}/{c}/{s}/metrics.parquet" for c, s in scored_rows()]


def encoder_files():
    """The encoder.json of every dense row: the pooling and similarity the table shows."""
    return [f"{RESULTS}/{c}/{s}/encoder.json" for c, s in scored_rows() if is_dense(s)]


def row_order():
    """The method order of the table's rows: the reference models first, then config methods."""
    return [*REFERENCES, *config["methods"]]


rule evaluate:
    input:
        code=stage_code("evaluate"),
        run=f"{RESULTS}/{{collection}}/{{system}}/run.parquet",
        passages=of_scored_collection(rules.split_passages.output.passages),
        queries=of_scored_collection(rules.ingest.output.queries),
        qrels=of_scored_collection(rules.ingest.output.qrels),
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
        split=scored_eval_split,
        metrics=config["evaluation"]["metrics"],
    shell:
        "python -m dprflow.stages.evaluate --run {input.run:q} --passages {input.passages:q}"
        " --queries {input.queries:q} --qrels {input.qrels:q} --split {params.split:q}"
        " --out {output.metrics:q} --doc-run {output.doc_run:q} --metrics {params.metrics:q} > {log:q} 2>&1"


rule compare:
    input:
        code=stage_code("compare"),
        metrics=metrics_files(),
        encoders=encoder_files(),
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
        methods=row_order(),
        baseline=config["evaluation"]["baseline"],
        also_against=config["evaluation"]["also_against"],
        results=compare_results_dir,
        paper_references=paper_references(),
        splits=scored_splits(),
        trained_on=trained_on_collections(),
        significance=config["evaluation"]["significance"],
        permutations=config["evaluation"]["permutations"],
        permutation_seed=config["evaluation"]["permutation_seed"],
        untrained=untrained_rows(),
    shell:
        "python -m dprflow.stages.compare --metrics-files {input.metrics:q} --results-dir {params.results:q}"
        " --encoder-files {input.encoders:q} --out-md {output.md:q} --out-csv {output.csv:q}"
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
        model=f"{RESULTS}/{{collection}}/{{method}}/seed-{{seed}}/{{stage}}/model",
        compare=rules.compare.output.csv,
    output:
        hub=directory(
            f"{RESULTS}/{{collection}}/{{method}}/seed-{{seed}}/{{stage}}/hub"
        ),
    log:
        f"{LOGS}/{{collection}}/{{method}}/seed-{{seed}}/export_model_{{stage}}.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/seed-{{seed}}/export_model_{{stage}}.tsv"
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
