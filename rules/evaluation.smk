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
    return " ".join(shlex.quote(p) for p in pairs)


def scored_splits():
    """collection=split pairs: the query split each collection's comparison scores."""
    return " ".join(
        shlex.quote(f"{c}={spec['eval_split']}")
        for c, spec in config["collections"].items()
    )


def trained_on_collections():
    """Collections whose scored split is their training split (score_training_queries)."""
    return " ".join(
        shlex.quote(c)
        for c in training_collections()
        if config["collections"][c]["eval_split"] == config["collections"][c]["train_split"]
    )


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
        metrics=" ".join(config["evaluation"]["metrics"]),
    shell:
        "python -m dprflow.stages.evaluate --run {input.run} --passages {input.passages}"
        " --queries {input.queries} --qrels {input.qrels} --split {params.split}"
        " --out {output.metrics} --metrics {params.metrics} > {log} 2>&1"


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
        metrics=" ".join(config["evaluation"]["metrics"]),
        methods=" ".join(row_order()),
        baseline=config["evaluation"]["baseline"],
        results=compare_results_dir,
        paper_references=paper_references(),
        splits=scored_splits(),
        trained_on=trained_on_collections(),
        untrained=untrained_rows(),
    shell:
        "python -m dprflow.stages.compare --metrics-files {input.metrics} --results-dir {params.results}"
        " --encoder-files {input.encoders} --out-md {output.md} --out-csv {output.csv}"
        " --metrics {params.metrics}"
        " --methods {params.methods} --baseline {params.baseline}"
        " --splits {params.splits} --trained-on {params.trained_on}"
        " --untrained-rows {params.untrained:q}"
        " --paper-references {params.paper_references} > {log} 2>&1"
