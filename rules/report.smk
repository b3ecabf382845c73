# The results report: `snakemake --report results/report.html` after a run gathers these figures
# and pages (report/*.rst hold their captions).


rule report_results:
    input:
        code=stage_code("report_results"),
        csv=rules.compare.output.csv,
        md=rules.compare.output.md,
        nb_recall=REPORT.nb_recall_files(),
        models=REPORT.training_model_dirs(),
    output:
        loss=report(
            f"{RESULTS}/report/training_loss.png",
            caption="../report/training_loss.rst",
            category="Figures",
            labels={"figure": "training loss"},
        ),
        nb_recall=report(
            f"{RESULTS}/report/nb_recall.png",
            caption="../report/nb_recall.rst",
            category="Figures",
            labels={"figure": "nb-recall"},
        ),
        metric=report(
            f"{RESULTS}/report/main_metric.png",
            caption="../report/main_metric.rst",
            category="Figures",
            labels={"figure": "main metric"},
        ),
        html=report(
            f"{RESULTS}/report/comparison.html",
            caption="../report/comparison.rst",
            category="Comparison",
            labels={"table": "methods and stages, with provenance"},
        ),
        config=report(
            f"{RESULTS}/report/config.yaml",
            caption="../report/config.rst",
            category="Configuration",
            labels={"file": "config used"},
        ),
    log:
        f"{LOGS}/report_results.log",
    benchmark:
        f"{BENCHMARKS}/report_results.tsv"
    conda:
        "../envs/evaluation.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        results=report_results_dir,
        metric=config["evaluation"]["metrics"][0],
        config=REPORT.config_json(),
    shell:
        "python -m dprflow.stages.report_results --compare-csv {input.csv:q} --compare-md {input.md:q}"
        " --results-dir {params.results:q} --config-json {params.config:q} --metric {params.metric:q}"
        " --nb-recall {input.nb_recall:q} --models {input.models:q} --out-loss {output.loss:q}"
        " --out-nb-recall {output.nb_recall:q} --out-metric {output.metric:q} --out-html {output.html:q}"
        " --out-config {output.config:q} > {log:q} 2>&1"


# `snakemake check` (make check): the latest comparison against config/expected/*.yaml,
# OK or FAIL per row; fails when a metric moved outside its tolerance.
rule check:
    input:
        code=stage_code("check"),
        csv=rules.compare.output.csv,
        expected=REPORT.expected_metrics_file,
    output:
        report=f"{RESULTS}/check.txt",
    log:
        f"{LOGS}/check.log",
    conda:
        "../envs/evaluation.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    shell:
        "python -m dprflow.stages.check --compare-csv {input.csv:q} --expected {input.expected:q}"
        " --out {output.report:q} 2>&1 | tee {log:q}"
