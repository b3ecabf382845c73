def pretrained_encoder(wildcards):
    """The pre-trained encoder folder of a method (an input of its retrievers); none for method none."""
    if encoder_is_stage_one(wildcards.method):
        return condenser_input(wildcards)
    if wildcards.method in CORPUS_PRETRAINED:
        return [
            result_path(wildcards.collection, wildcards.method, "pretrain", "model")
        ]
    return []


def encoder_is_stage_one(method):
    """The method fine-tunes the stage-one Condenser itself (condenser: no corpus stage), which is
    pretrain.cocondenser.init or the model pretrain_generic trains here."""
    record = METHOD_RECORDS.get(method)
    return record is not None and record.encoder == "generic"


def method_init(wildcards):
    """The checkpoint a method's fine-tuning starts from (method none: the initial model, INIT; a
    reference row ref-<name>: its model)."""
    if encoder_is_stage_one(wildcards.method):
        return condenser_model()
    encoder = pretrained_encoder(wildcards)
    if encoder:
        return encoder[0]
    if wildcards.method in REFERENCES:
        return REFERENCES[wildcards.method]["model"]
    return INIT


def init_fingerprint(wildcards):
    """The content (see content_fingerprint) of the user's folder a job starts from: model.init for
    the retrievers of method none, pretrain.cocondenser.init for the condenser row's; among dense
    rows only the zeroshot one reads it."""
    if split_transfer(getattr(wildcards, "retriever", "zeroshot"))[0] != "zeroshot":
        return ""
    if wildcards.method in REFERENCES:
        return content_fingerprint(REFERENCES[wildcards.method]["model"])
    if encoder_is_stage_one(wildcards.method):
        return content_fingerprint(PT["cocondenser"]["init"])
    if pretrained_encoder(wildcards):
        return ""
    return model_init_fingerprint(wildcards)


def shards():
    return list(range(FT["encode_shards"]))


def geometry_flags(pooling, similarity):
    """--pooling/--similarity where set; a stage takes the model's own for those left out."""
    flags = [
        f"--{k} {q(v)}"
        for k, v in (("pooling", pooling), ("similarity", similarity))
        if v
    ]
    return "".join(f" {f}" for f in flags)


def initial_geometry(method):
    """(pooling, similarity) of a method's initial model where the config or the method fixes
    them; None leaves the stage to read the model's own (model.init: its sentence-transformers
    configuration, else cls and dot)."""
    if method == "none":
        return config["model"]["pooling"], config["model"]["similarity"]
    if method in GEOMETRY_CONTROLS:
        return GEOMETRY_CONTROLS[method]
    if method in REFERENCES:
        return REFERENCES[method]["pooling"], REFERENCES[method]["similarity"]
    return PRETRAINED_POOLING.get(method), None


def finetune_geometry(method):
    """Fine-tuning's pooling and similarity: finetune.* where set, else the initial model's own."""
    pooling, similarity = initial_geometry(method)
    return FT["pooling"] or pooling, FT["similarity"] or similarity


def native_retriever(wildcards):
    """The retriever without its transfer suffix: the model is the same whatever it encodes."""
    return split_transfer(wildcards.retriever)[0]


def encoder_inputs(wildcards):
    """The trained model folder of a retriever; for a zeroshot row, the method's pre-trained
    encoder, or the off-the-shelf model where it is a local folder."""
    retriever = native_retriever(wildcards)
    if retriever == "zeroshot":
        return pretrained_encoder(wildcards) or init_input(method_init(wildcards))
    return result_path(wildcards.collection, wildcards.method, retriever, "model")


def run_tag(wildcards):
    """The TREC run tag of a dense run: method, seed and stage, e.g. none-seed-13-r2 (none-seed-13-r2-on-cisi)."""
    return "-".join([wildcards.method, *Path(wildcards.retriever).parts])


def encoder_flags(wildcards):
    """The encoder of a dense run and its precision (passages, and queries unless the embeddings
    record theirs): a zeroshot row's initial model as it ships (or as model.* says), else the
    trained folder with the geometry it was trained with."""
    retriever = native_retriever(wildcards)
    if retriever == "zeroshot":
        geometry = geometry_flags(*initial_geometry(wildcards.method))
        model = f"--model {q(method_init(wildcards))}{geometry}"
    else:
        model = f"--model {q(result_path(wildcards.collection, wildcards.method, retriever, 'model'))}"
    return f"{model} {precision_flag(config)}"


def embedding_shards(wildcards):
    base = result_path(wildcards.collection, wildcards.method, wildcards.retriever)
    return [f"{base}/embeddings/shard_{s}.parquet" for s in shards()]


def embeddings_output():
    """A shard of corpus embeddings: removed once every job that reads it is done, unless
    finetune.keep_embeddings (a BERT-base row of MS MARCO holds about 27 GB)."""
    path = f"{RESULTS}/{{collection}}/{{method}}/{{retriever}}/embeddings/shard_{{shard}}.parquet"
    return path if FT["keep_embeddings"] else temp(path)


def faiss_index_dirs():
    """The pyserini FaissSearcher folder of every dense row, when finetune.faiss_index is on."""
    if not FT["faiss_index"]:
        return []
    return [
        f"{RESULTS}/{c}/{row}/faiss"
        for c, row in scored_rows()
        if is_dense(row) and split_transfer(row)[1] is None
    ]


def train_depth():
    """Training-query runs feed mining (K2) and the reranker (K3)."""
    return max(FT["mining_depth"], FT["reranker"]["depth"])


def retriever_inputs(wildcards):
    """The pre-trained encoder, negative pools (and teacher scores) of each trained retriever."""
    base = result_path(wildcards.collection)
    seed = wildcards.seed
    method = result_path(wildcards.collection, wildcards.method, f"seed-{seed}")
    out = {}
    if pretrained_encoder(wildcards):
        out["encoder"] = pretrained_encoder(wildcards)[0]
    elif model_init_input(wildcards):
        out["encoder"] = model_init_input(wildcards)[0]
    if wildcards.trained == "r1" or is_point(wildcards):
        out["negatives"] = f"{base}/bm25/negatives.parquet"
    elif wildcards.trained == "r2":
        out["negatives"] = f"{method}/r1/negatives.parquet"
        if FT["r2_bm25_fraction"] > 0:
            out["extra"] = f"{base}/bm25/negatives.parquet"
    else:
        out["negatives"] = f"{method}/r2/negatives.parquet"
        out["teacher"] = f"{method}/rerank/teacher_scores.parquet"
    return out


def retriever_flags(wildcards):
    """Hyper-parameters of one trained retriever (distillation has its own section)."""
    inputs = retriever_inputs(wildcards)
    # a grid point is retriever 1 trained on the fit part with the point's settings
    role = "r1" if is_point(wildcards) else wildcards.trained
    common = (
        f"--method {q(wildcards.method)} --role {q(role)}"
        + geometry_flags(*finetune_geometry(wildcards.method))
        + f" --shared {q(str(FT['shared_encoder']).lower())} --seed {q(wildcards.seed)}"
        f" --max-query-length {q(FT['max_query_length'])} --max-passage-length {q(FT['max_passage_length'])}"
    )
    if wildcards.trained == "distill":
        d = FT["distill"]
        flags = (
            f" --teacher {q(inputs['teacher'])} --alpha {q(d['alpha'])} --direction {q(d['direction'])}"
            f" --student-over {q(d['student_over'])}"
        )
    else:
        d = retriever_section(wildcards)
        flags = selection_flag(wildcards)
    temperature = d[
        "temperature"
    ]  # null: the similarity's default (1 dot, 0.05 cosine) ...
    record = METHOD_RECORDS.get(wildcards.method)
    if temperature is None and record and record.pretraining_temperature:
        # ... but Contriever's rows fine-tune at "a temperature of 0.05, also used during
        # pretraining" (Contriever Appendix A): pretrain.contriever.temperature
        temperature = PT[wildcards.method]["temperature"]
    if temperature is not None:
        flags += f" --temperature {q(temperature)}"
    if "extra" in inputs:
        flags += f" --extra-negatives {q(inputs['extra'])} --extra-fraction {q(FT['r2_bm25_fraction'])}"
    return f"{common}{flags}{optim_flags(d)} --chunk-size {q(d['chunk_size'])} {training_flags(config, SCHEMA)}"


def mining_depth(wildcards):
    return FT["mining_depth"] if wildcards.trained == "r1" else FT["reranker"]["depth"]


def search_flags(wildcards):
    """The encoder's flags, and --shard-at-a-time where finetune.search_shard_at_a_time is set
    (left out when not, so a default run's command line is the one before the key existed).
    """
    flags = encoder_flags(wildcards)
    if FT["search_shard_at_a_time"]:
        flags += " --shard-at-a-time true"
    return flags


def retriever_section(wildcards):
    if wildcards.trained == "distill":
        return FT["distill"]
    if is_point(wildcards):
        return {**FT["retriever"], **point_settings(wildcards)}
    return FT["retriever"]


def train_retriever_mem_mb(wildcards):
    return RESOURCES.training(retriever_section(wildcards), wildcards.collection)[0]


def train_retriever_runtime(wildcards):
    return RESOURCES.training(retriever_section(wildcards), wildcards.collection)[1]
