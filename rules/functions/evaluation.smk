def compare_results_dir(wildcards, output):
    """The results folder the compared metrics files are relative to (where compare.md goes)."""
    return os.path.dirname(output.md)


def hub_folders():
    """The upload-ready folder of every trained model of every row (export_model)."""
    return [
        f"{RESULTS}/{c}/{m}/seed-{seed}/{stage}/hub"
        for c in ROWS.training_collections()
        for m in config["methods"]
        for seed in ROWS.seeds()
        for stage in ROWS.stages(m)
    ]


def metrics_files():
    return [f"{RESULTS}/{c}/{s}/metrics.parquet" for c, s in ROWS.scored()]


def encoder_files():
    """The encoder.json of every dense row: the pooling and similarity the table shows."""
    return [f"{RESULTS}/{c}/{s}/encoder.json" for c, s in ROWS.scored() if is_dense(s)]


def row_order():
    """The method order of the table's rows: the reference models first, then config methods."""
    return [*REFERENCES, *config["methods"]]
