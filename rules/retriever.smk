# Bi-encoder retrievers: training (retriever 1, retriever 2, distilled), corpus encoding in
# shards, exact search, hard-negative mining, and neighbourhood recall between retrievers 1 and 2.
# Fine-tuned outputs live in results/<collection>/<method>/seed-<seed>/ (one per config seed);
# the off-the-shelf encoders in results/<collection>/<method>/zeroshot/ (model.references: method
# ref-<name>). A row scored on another collection than its own (transfer evaluation) encodes and
# searches that collection in <row>/on-<collection>/ (search_eval).


def pretrained_encoder(wildcards):
    """The pre-trained encoder folder of a method (an input of its retrievers); none for method none."""
    if wildcards.method == "condenser":  # a hub id (pretrain.cocondenser.init) is no input
        init = PT["cocondenser"]["init"]
        return local_paths(init) if init else [condenser_model()]
    if wildcards.method in CORPUS_PRETRAINED:
        return [result_path(wildcards.collection, wildcards.method, "pretrain", "model")]
    return []


def method_init(wildcards):
    """The checkpoint a method's fine-tuning starts from (method none: model.init itself; a
    reference row ref-<name>: its model)."""
    if wildcards.method == "condenser":
        return condenser_model()
    encoder = pretrained_encoder(wildcards)
    if encoder:
        return encoder[0]
    if wildcards.method in REFERENCES:
        return REFERENCES[wildcards.method]["model"]
    return config["model"]["init"]


def init_fingerprint(wildcards):
    """The content (see content_fingerprint) of the user's folder a job starts from: model.init for
    the retrievers of method none, pretrain.cocondenser.init for the condenser row's; among dense
    rows only the zeroshot one reads it."""
    if split_transfer(getattr(wildcards, "retriever", "zeroshot"))[0] != "zeroshot":
        return ""
    if wildcards.method in REFERENCES:
        return content_fingerprint(REFERENCES[wildcards.method]["model"])
    if wildcards.method == "condenser":
        return content_fingerprint(PT["cocondenser"]["init"])
    if pretrained_encoder(wildcards):
        return ""
    return model_init_fingerprint(wildcards)


def shards():
    return list(range(FT["encode_shards"]))


def geometry_flags(pooling, similarity):
    """--pooling/--similarity where set; a stage takes the model's own for those left out."""
    flags = [
        f"--{k} {q(v)}" for k, v in (("pooling", pooling), ("similarity", similarity)) if v
    ]
    return "".join(f" {f}" for f in flags)


def initial_geometry(method):
    """(pooling, similarity) of a method's initial model where the config or the method fixes
    them; None leaves the stage to read the model's own (model.init: its sentence-transformers
    configuration, else cls and dot)."""
    if method == "none":
        return config["model"]["pooling"], config["model"]["similarity"]
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
        return pretrained_encoder(wildcards) or local_paths(method_init(wildcards))
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
        model = f"--model {q(method_init(wildcards))}" + geometry_flags(
            *initial_geometry(wildcards.method)
        )
    else:
        model = f"--model {q(result_path(wildcards.collection, wildcards.method, retriever, 'model'))}"
    return f"{model} {precision_flag()}"


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
    method = result_path(wildcards.collection, wildcards.method, "seed-" + wildcards.seed)
    out = {}
    if pretrained_encoder(wildcards):
        out["encoder"] = pretrained_encoder(wildcards)[0]
    elif model_init_input(wildcards):
        out["encoder"] = model_init_input(wildcards)[0]
    if wildcards.trained == "r1":
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
    common = (
        f"--method {q(wildcards.method)} --role {q(wildcards.trained)}"
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
        d = FT["retriever"]
        flags = ""
    temperature = d["temperature"]  # null: the similarity's default (1 dot, 0.05 cosine) ...
    if temperature is None and wildcards.method == "contriever":
        # ... but Contriever's rows fine-tune at "a temperature of 0.05, also used during
        # pretraining" (Contriever Appendix A): pretrain.contriever.temperature
        temperature = PT["contriever"]["temperature"]
    if temperature is not None:
        flags += f" --temperature {q(temperature)}"
    if "extra" in inputs:
        flags += f" --extra-negatives {q(inputs['extra'])} --extra-fraction {q(FT['r2_bm25_fraction'])}"
    return f"{common}{flags}{optim_flags(d)} --chunk-size {q(d['chunk_size'])} {training_flags()}"


def mining_depth(wildcards):
    return FT["mining_depth"] if wildcards.trained == "r1" else FT["reranker"]["depth"]


def encode_mem_mb(wildcards):
    per_shard = passages_estimate(wildcards.collection) // FT["encode_shards"] + 1
    return int(3000 + 3 * per_shard * EMBED_BYTES / 2**20)


def encode_runtime(wildcards):
    per_shard = passages_estimate(wildcards.collection) // FT["encode_shards"] + 1
    return int(15 + per_shard / ENCODE_PER_S / 60)


def search_mem_mb(wildcards):
    """The whole flat index is held at once, or one shard of it with
    finetune.search_shard_at_a_time (queries are searched in batches)."""
    held = passages_estimate(wildcards.collection)
    if FT["search_shard_at_a_time"]:
        held /= FT["encode_shards"]
    return int(3000 + 1.5 * held * EMBED_BYTES / 2**20)


def search_flags(wildcards):
    """The encoder's flags, and --shard-at-a-time where finetune.search_shard_at_a_time is set
    (left out when not, so a default run's command line is the one before the key existed)."""
    flags = encoder_flags(wildcards)
    if FT["search_shard_at_a_time"]:
        flags += " --shard-at-a-time true"
    return flags


def search_runtime(wildcards):
    return int(15 + passages_estimate(wildcards.collection) / 200_000)


def retriever_section(wildcards):
    return FT["distill"] if wildcards.trained == "distill" else FT["retriever"]


def train_retriever_mem_mb(wildcards):
    return _train_resources(retriever_section(wildcards), wildcards.collection)[0]


def train_retriever_runtime(wildcards):
    return _train_resources(retriever_section(wildcards), wildcards.collection)[1]


rule train_retriever:
    input:
        unpack(retriever_inputs),
        code=stage_code("train_retriever"),
        queries=rules.ingest.output.queries,
        qrels=rules.ingest.output.qrels,
        passages=rules.split_passages.output.passages,
    output:
        model=directory(
            f"{RESULTS}/{{collection}}/{{method}}/seed-{{seed}}/{{trained}}/model"
        ),
    log:
        f"{LOGS}/{{collection}}/{{method}}/seed-{{seed}}/train_retriever_{{trained}}.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/seed-{{seed}}/train_retriever_{{trained}}.tsv"
    conda:
        "../envs/training.yaml"
    threads: 2
    resources:
        mem_mb=train_retriever_mem_mb,
        runtime=train_retriever_runtime,
        # how often to save, not what is trained: a resource, so changing it reruns nothing
        checkpoint_every=FT["checkpoint_every"],
        log_every=config["training"]["log_every"],
        num_workers=config["training"]["num_workers"],
    params:
        fingerprint=init_fingerprint,
        launch=training_launcher,
        init=method_init,
        split=train_split,
        flags=retriever_flags,
        checkpoints=f"{RESULTS}/{{collection}}/{{method}}/seed-{{seed}}/{{trained}}/checkpoints",
    shell:
        "{params.launch} -m dprflow.stages.train_retriever --init {params.init:q} --queries {input.queries:q}"
        " --qrels {input.qrels:q} --passages {input.passages:q} --negatives {input.negatives:q}"
        " --split {params.split:q} --out {output.model:q} --checkpoint-dir {params.checkpoints:q}"
        " {params.flags} --checkpoint-every {resources.checkpoint_every} --log-every {resources.log_every} --num-workers {resources.num_workers} --mem-mb {resources.mem_mb}"
        " --threads {threads} > {log:q} 2>&1"


rule encode_corpus:
    input:
        code=stage_code("encode_corpus"),
        passages=of_scored_collection(rules.split_passages.output.passages),
        model=encoder_inputs,
    output:
        embeddings=embeddings_output(),
    log:
        f"{LOGS}/{{collection}}/{{method}}/{{retriever}}/encode_corpus_{{shard}}.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/{{retriever}}/encode_corpus_{{shard}}.tsv"
    conda:
        "../envs/training.yaml"
    threads: 2
    resources:
        mem_mb=encode_mem_mb,
        runtime=encode_runtime,
    params:
        fingerprint=init_fingerprint,
        flags=encoder_flags,
        num_shards=FT["encode_shards"],
        max_length=FT["max_passage_length"],
        batch_size=FT["encode_batch_size"],
    shell:
        "python -m dprflow.stages.encode_corpus {params.flags} --passages {input.passages:q}"
        " --out {output.embeddings:q} --shard {wildcards.shard:q} --num-shards {params.num_shards:q}"
        " --max-length {params.max_length:q} --batch-size {params.batch_size:q} --threads {threads}"
        " > {log:q} 2>&1"


rule search_dense:
    # a fine-tuned retriever on its own collection: the evaluation and the training queries
    wildcard_constraints:
        retriever=TRAINED_RETRIEVER,
    input:
        code=stage_code("search_dense"),
        embeddings=embedding_shards,
        queries=rules.ingest.output.queries,
        model=encoder_inputs,
    output:
        run=f"{RESULTS}/{{collection}}/{{method}}/{{retriever}}/run.parquet",
        trec=f"{RESULTS}/{{collection}}/{{method}}/{{retriever}}/run.trec",
        encoder=f"{RESULTS}/{{collection}}/{{method}}/{{retriever}}/encoder.json",
        train_run=f"{RESULTS}/{{collection}}/{{method}}/{{retriever}}/train_run.parquet",
    log:
        f"{LOGS}/{{collection}}/{{method}}/{{retriever}}/search_dense.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/{{retriever}}/search_dense.tsv"
    conda:
        "../envs/training.yaml"
    threads: 2
    resources:
        mem_mb=search_mem_mb,
        runtime=search_runtime,
    params:
        fingerprint=init_fingerprint,
        flags=search_flags,
        eval_split=eval_split,
        train_split=train_split,
        depth=FT["search_depth"],
        train_depth=train_depth(),
        max_length=FT["max_query_length"],
        tag=run_tag,
    shell:
        "python -m dprflow.stages.search_dense {params.flags} --embeddings {input.embeddings:q}"
        " --queries {input.queries:q} --out {output.run:q} --trec {output.trec:q} --encoder-out {output.encoder:q}"
        " --train-out {output.train_run:q} --eval-split {params.eval_split:q}"
        " --train-split {params.train_split:q} --depth {params.depth:q}"
        " --train-depth {params.train_depth:q} --max-length {params.max_length:q}"
        " --tag {params.tag:q} --threads {threads} > {log:q} 2>&1"


# A row that needs no training run: an off-the-shelf (zeroshot) row, or a row scored on another
# collection than the one it was trained on (transfer); only the evaluation queries are searched.
rule search_eval:
    wildcard_constraints:
        retriever=EVAL_ONLY_RETRIEVER,
    input:
        code=stage_code("search_dense"),
        embeddings=embedding_shards,
        queries=of_scored_collection(rules.ingest.output.queries),
        model=encoder_inputs,
    output:
        run=f"{RESULTS}/{{collection}}/{{method}}/{{retriever}}/run.parquet",
        trec=f"{RESULTS}/{{collection}}/{{method}}/{{retriever}}/run.trec",
        encoder=f"{RESULTS}/{{collection}}/{{method}}/{{retriever}}/encoder.json",
    log:
        f"{LOGS}/{{collection}}/{{method}}/{{retriever}}/search_dense.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/{{retriever}}/search_dense.tsv"
    conda:
        "../envs/training.yaml"
    threads: 2
    resources:
        mem_mb=search_mem_mb,
        runtime=search_runtime,
    params:
        fingerprint=init_fingerprint,
        flags=search_flags,
        eval_split=scored_eval_split,
        depth=FT["search_depth"],
        max_length=FT["max_query_length"],
        tag=run_tag,
    shell:
        "python -m dprflow.stages.search_dense {params.flags} --embeddings {input.embeddings:q}"
        " --queries {input.queries:q} --out {output.run:q} --trec {output.trec:q}"
        " --encoder-out {output.encoder:q} --eval-split {params.eval_split:q} --depth {params.depth:q}"
        " --max-length {params.max_length:q} --tag {params.tag:q} --threads {threads:q} > {log:q} 2>&1"


rule export_faiss:
    input:
        code=stage_code("export_faiss"),
        embeddings=embedding_shards,
        encoder=rules.search_dense.output.encoder,
    output:
        index=directory(f"{RESULTS}/{{collection}}/{{method}}/{{retriever}}/faiss"),
    log:
        f"{LOGS}/{{collection}}/{{method}}/{{retriever}}/export_faiss.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/{{retriever}}/export_faiss.tsv"
    conda:
        "../envs/training.yaml"
    threads: 1
    resources:
        mem_mb=search_mem_mb,
        runtime=search_runtime,
    params:
        max_query_length=FT["max_query_length"],
    shell:
        "python -m dprflow.stages.export_faiss --embeddings {input.embeddings:q}"
        " --encoder {input.encoder:q} --max-query-length {params.max_query_length:q}"
        " --out {output.index:q} > {log:q} 2>&1"


rule mine_negatives:
    input:
        code=stage_code("mine_negatives"),
        run=f"{RESULTS}/{{collection}}/{{method}}/seed-{{seed}}/{{trained}}/train_run.parquet",
        qrels=rules.ingest.output.qrels,
        passages=rules.split_passages.output.passages,
    output:
        negatives=f"{RESULTS}/{{collection}}/{{method}}/seed-{{seed}}/{{trained}}/negatives.parquet",
    log:
        f"{LOGS}/{{collection}}/{{method}}/seed-{{seed}}/mine_negatives_{{trained}}.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/seed-{{seed}}/mine_negatives_{{trained}}.tsv"
    conda:
        "../envs/evaluation.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        depth=mining_depth,
    shell:
        "python -m dprflow.stages.mine_negatives --run {input.run:q} --qrels {input.qrels:q}"
        " --passages {input.passages:q} --out {output.negatives:q} --depth {params.depth:q} > {log:q} 2>&1"


rule nb_recall:
    input:
        code=stage_code("nb_recall"),
        run_r1=f"{RESULTS}/{{collection}}/{{method}}/seed-{{seed}}/r1/run.parquet",
        run_r2=f"{RESULTS}/{{collection}}/{{method}}/seed-{{seed}}/r2/run.parquet",
    output:
        table=f"{RESULTS}/{{collection}}/{{method}}/seed-{{seed}}/nb_recall.parquet",
    log:
        f"{LOGS}/{{collection}}/{{method}}/seed-{{seed}}/nb_recall.log",
    benchmark:
        f"{BENCHMARKS}/{{collection}}/{{method}}/seed-{{seed}}/nb_recall.tsv"
    conda:
        "../envs/evaluation.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        n=FT["nb_recall_n"],
        k=FT["nb_recall_k"],
    shell:
        "python -m dprflow.stages.nb_recall --run-r1 {input.run_r1:q} --run-r2 {input.run_r2:q}"
        " --out {output.table:q} --n {params.n:q} --k {params.k:q} > {log:q} 2>&1"
