def report_results_dir(wildcards, output):
    """The results folder (the report pages live in its report/ subfolder)."""
    return os.path.dirname(os.path.dirname(output.html))


def nb_recall_files():
    """Retriever 1's and 2's recall of the negatives (methods with both rows)."""
    return [
        f"{RESULTS}/{c}/{m}/seed-{s}/nb_recall.parquet"
        for c in ROWS.training_collections()
        for m in config["methods"]
        if {"r1", "r2"} <= set(ROWS.stages(m))
        for s in ROWS.seeds()
    ]


def pretrained_models(collection, method):
    """Every pre-training model folder of a method (stage one and two), for the loss curves."""
    record = METHOD_RECORDS.get(method)  # a reference row's method has none
    if record is None or record.family is None:
        return []
    stage_one = []
    if record.family == "condenser":
        stage_one = MODELS.condenser_stage_one()
    elif record.family == "mae" and not PT["mae"]["corpus_init"]:
        # no generic stage when the corpus stage starts from pretrain.mae.corpus_init
        stage_one = [f"{RESULTS}/pretrain/{record.generic}/generic/model"]
    corpus = (
        [f"{RESULTS}/{collection}/{method}/pretrain/model"]
        if record.corpus_stage
        else []
    )
    return stage_one + corpus


def training_model_dirs():
    """The model folder of every training stage of the run; each holds its train_log.csv."""
    dirs = [MLM_MODEL] if MLM_BASE else []
    for c in ROWS.training_collections():
        for m in config["methods"]:
            dirs += pretrained_models(c, m)
            dirs += [
                f"{RESULTS}/{c}/{m}/seed-{seed}/{s}/model"
                for seed in ROWS.seeds()
                for s in ROWS.stages(m)
            ]
    return list(dict.fromkeys(dirs))


def config_json():
    """The config the report records, less RESOURCE_SETTINGS: they change no result, and a
    param of this rule would rerun it (the report) when one changed; and less model.mlm unless
    model.init is mlm (no model is trained from it then)."""
    recorded = copy.deepcopy(config)
    if not MLM_BASE:
        recorded["model"].pop("mlm", None)
    for key in RESOURCE_SETTINGS:
        *sections, name = key.split(".")
        node = recorded
        for section in sections:
            node = node.get(section, {})
        node.pop(name, None)
    return json.dumps(recorded, sort_keys=True)


def expected_metrics_file(wildcards):
    path = config["evaluation"]["expected"]
    if not path:
        raise ValueError(
            "evaluation.expected is not set: name a file of expected metrics to check against"
        )
    return path
