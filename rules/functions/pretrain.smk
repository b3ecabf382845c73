def tokenizer_key(name):
    """The folder name of a tokenizer's stores: its model name or path, other characters as _."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "tokenizer"


def tokens_path(corpus, view, tokenizer=None):
    """A token store: ``corpus`` is a collection, a pretrain.corpora name or ``pretrain`` (the
    generic corpus); ``tokenizer`` defaults to the initial model's (INIT_TOKENIZER)."""
    key = tokenizer_key(tokenizer or INIT_TOKENIZER)
    return f"{RESULTS}/{corpus}/tokens/{key}/{view}"


def tokenize_corpus_input(wildcards):
    if wildcards.corpus == "pretrain":
        return generic_corpus_input(wildcards)
    return [result_path(wildcards.corpus, "passages.parquet")]


def tokenizer_name(wildcards):
    """The model name or path whose tokenizer writes a store."""
    if wildcards.tokenizer not in TOKENIZERS:
        raise ValueError(
            f"token store {wildcards.tokenizer!r}: not the key of a configured tokenizer "
            f"({sorted(TOKENIZERS)})"
        )
    return TOKENIZERS[wildcards.tokenizer]


def tokenizer_input(wildcards):
    """The tokenizer's folder when it is local: an input of the store's rule."""
    return local_paths(tokenizer_name(wildcards))


def tokenizer_fingerprint(wildcards):
    return content_fingerprint(tokenizer_name(wildcards))


def tokenize_flags(wildcards):
    generic = wildcards.corpus == "pretrain"
    if generic != wildcards.view.startswith("text"):
        raise ValueError(
            f"token store view {wildcards.view!r} does not apply to corpus {wildcards.corpus!r} "
            "(texts and text-sentences: the generic corpus 'pretrain'; the others: passages)"
        )
    flags = f"--tokenizer {q(tokenizer_name(wildcards))}"
    if generic:
        flags += f" --corpus {q(PT['generic_corpus']['source'])}"
    for path in tokenize_corpus_input(wildcards):
        flags += f" --corpus-path {shlex.quote(path)}"
    return flags


def cocondenser_tokens(wildcards):
    """coCondenser's documents, or a query-as-context method's passages, of the corpus stage two
    reads (pretrain.cocondenser.corpus), as a token store of the stage-one Condenser's tokenizer.
    """
    view = "passages" if wildcards.cocondenser in QAC_METHODS else "documents"
    return tokens_path(corpus_stage_corpus(wildcards), view, PT["cocondenser"]["init"])


def contriever_tokens(wildcards):
    """The collection's documents, or with pretrain.contriever.corpus generic the generic
    corpus's texts, as a token store."""
    if PT["contriever"]["corpus"] == "generic":
        return tokens_path("pretrain", "texts")
    return tokens_path(wildcards.collection, "documents")


def condenser_tokens(wildcards):
    return tokens_path("pretrain", "texts")


def mae_generic_tokens(wildcards):
    """BMAE/CoT-MAE generic corpus store; none for CDMAE (its store holds the importance from
    the n-gram counts: the stage writes its own)."""
    variant = mae_variant(wildcards)
    # A generic corpus of passages is read as a collection's (documents for CoT-MAE): the stage
    # tokenizes it itself.
    if variant == "cdmae" or PT["generic_corpus"]["source"] == "passages":
        return []
    return [
        tokens_path("pretrain", "text-sentences" if variant == "cotmae" else "texts")
    ]


def mae_corpus_tokens(wildcards):
    variant = mae_variant(wildcards)
    if variant == "cdmae":
        return []
    if wildcards.mae_method in QAC_METHODS:
        view = "passages"
    else:
        view = "document-sentences" if variant == "cotmae" else "passages"
    return [tokens_path(corpus_stage_corpus(wildcards), view, PT["mae"]["corpus_init"])]


def generic_corpus_input(wildcards):
    path = PT["generic_corpus"]["path"]
    return [path] if path else []


MLM = config["model"]["mlm"]


def mlm_tokens(wildcards):
    """The generic corpus's texts as a token store of the MLM base's tokenizer."""
    return tokens_path("pretrain", "texts", MLM["tokenizer"])


def mlm_tokenizer_input(wildcards):
    """model.mlm.tokenizer when it is a local folder."""
    return local_paths(MLM["tokenizer"])


def mlm_tokenizer_fingerprint(wildcards):
    return content_fingerprint(MLM["tokenizer"])


def pretrain_mlm_flags(wildcards):
    return (
        f"{generic_corpus_flags(PT)} --seed {q(FT['seed'])}"
        f" {schema_flags(config, SCHEMA, 'model.mlm')} {training_flags(config, SCHEMA)}"
    )


def pretrain_generic_flags(wildcards):
    flags = f"{generic_corpus_flags(PT)} --seed {q(FT['seed'])}"
    condenser = schema_flags(config, SCHEMA, "pretrain.condenser")
    return f"{flags} {condenser} {training_flags(config, SCHEMA)}"


def pretrain_corpus_flags(wildcards):
    """Flags of a pretrain_corpus job; a query-as-context job also reads the generated queries
    and its passages' length (query-as-context section 4.2: 144 tokens)."""
    queries = "".join(
        f" --queries {shlex.quote(p)}"
        f" --max-passage-tokens {q(PT['cocondenser']['qac_passage_tokens'])}"
        for p in qac_queries_input(wildcards)
    )
    # init and corpus choose the stage's inputs; qac_passage_tokens goes with the queries
    section = schema_flags(
        config,
        SCHEMA,
        "pretrain.cocondenser",
        passed_otherwise=("init", "corpus", "qac_passage_tokens"),
    )
    return f"--seed {q(FT['seed'])} {section}{queries} {training_flags(config, SCHEMA)}"


def cocondenser_init_fingerprint(wildcards):
    """The content of a local pretrain.cocondenser.init folder (see content_fingerprint)."""
    return content_fingerprint(PT["cocondenser"]["init"])


def cocondenser_init_input(wildcards):
    """The stage-one Condenser as an input of stage two: pretrain.cocondenser.init when it is a
    local folder (a hub id is no input), else the model pretrain_generic trains here."""
    if PT["cocondenser"]["init"]:
        return local_paths(PT["cocondenser"]["init"])
    return rules.pretrain_generic.output.model


def pmi_corpus_input(wildcards):
    """The texts whose n-grams are counted: a collection's passages, or the generic corpus file."""
    if wildcards.corpus == "pretrain":
        return generic_corpus_input(wildcards)
    return [result_path(wildcards.corpus, "passages.parquet")]


def pmi_count_flags(wildcards):
    p = PT["pmi"]
    if wildcards.corpus == "pretrain":
        source = PT["generic_corpus"]["source"]
    else:
        source = "passages"
    flags = f"--corpus {q(source)} --shards {q(p['shards'])} --max-n {q(p['max_n'])} --max-distinct {q(p['max_distinct'])}"
    for path in pmi_corpus_input(wildcards):
        flags += f" --corpus-path {shlex.quote(path)}"
    return flags


def pmi_count_mem_mb(wildcards):
    """Counting holds up to max_distinct entries of 16 bytes, twice while combining, plus a batch."""
    return 1000 + 32 * PT["pmi"]["max_distinct"] // 2**20


def pmi_shard_files(wildcards):
    return [
        result_path(wildcards.corpus, "pmi", "counts", f"{s}.parquet")
        for s in range(PT["pmi"]["shards"])
    ]


def _mae_pmi(wildcards, corpus):
    """CDMAE's n-gram statistics of the corpus pre-trained on; the other MAEs need none."""
    if mae_variant(wildcards) != "cdmae":
        return []
    return [f"{RESULTS}/{corpus}/pmi/ngram_counts.parquet"]


def mae_generic_pmi(wildcards):
    return _mae_pmi(wildcards, "pretrain")


def mae_corpus_pmi(wildcards):
    return _mae_pmi(wildcards, corpus_stage_corpus(wildcards))


def mae_variant(wildcards):
    """The MAE a pre-training job trains: its generic ({mae}) or corpus ({mae_method}) wildcard;
    qac-cotmae is CoT-MAE with query contexts."""
    if "mae" in wildcards.keys():
        return wildcards.mae
    return QAC_METHODS.get(wildcards.mae_method, wildcards.mae_method)


def mae_generic_model(wildcards):
    """The generic stage's model, an input of the corpus stage; none when pretrain.mae.corpus_init
    names the checkpoint to start from (CDMAE footnote 4: RetroMAE)."""
    if PT["mae"]["corpus_init"]:
        return []
    return f"{RESULTS}/pretrain/{mae_variant(wildcards)}/generic/model"


def mae_corpus_init(wildcards):
    return PT["mae"]["corpus_init"] or mae_generic_model(wildcards)


def corpus_stage_corpus(wildcards):
    """The name whose passages a corpus-stage job reads: pretrain.cocondenser.corpus (coCondenser
    and query-as-context coCondenser) or pretrain.mae.corpus.documents (the MAEs), a corpus of
    pretrain.corpora (e.g. msmarco-document cut into passages of passages.max_tokens, coCondenser
    4.1, query-as-context 4.1); else the collection's own."""
    if "cocondenser" in wildcards.keys():
        key, name = "pretrain.cocondenser.corpus", PT["cocondenser"]["corpus"]
    else:
        key, name = "pretrain.mae.corpus.documents", PT["mae"]["corpus"]["documents"]
    if name and name not in PT["corpora"]:
        raise ValueError(
            f"{key}: {name!r} is not a name of pretrain.corpora "
            f"({sorted(PT['corpora']) or 'none defined'})"
        )
    return name or wildcards.collection


def corpus_stage_passages(wildcards):
    """The passages a corpus-stage job reads: coCondenser samples span pairs from their documents
    (query-as-context pairs them with their queries), CoT-MAE joins them back into documents.
    """
    return f"{RESULTS}/{corpus_stage_corpus(wildcards)}/passages.parquet"


def qac_queries_input(wildcards):
    """A query-as-context method's doc2query queries of the passages it reads; none for the
    other methods."""
    method = wildcards.get("cocondenser") or wildcards.get("mae_method")
    if method not in QAC_METHODS:
        return []
    return [
        f"{RESULTS}/{corpus_stage_corpus(wildcards)}/doc2query/generated_queries.parquet"
    ]


def mae_generic_flags(wildcards):
    return mae_flags(wildcards, "generic")


def mae_corpus_flags(wildcards):
    return mae_flags(wildcards, "corpus")


def mae_flags(wildcards, phase):
    """Flags of a pretrain_mae job: shared MAE settings, the method's decoder mask ratio and
    projection, the phase's budget and (generic phase) the corpus."""
    m = PT["mae"]
    flags = [
        f"--seed {q(FT['seed'])}",
        f"--p-dec {q(m['p_dec'][mae_variant(wildcards)])}",
        f"--use-projection {q(str(m['use_projection'][mae_variant(wildcards)]).lower())}",
        # p_dec and use_projection per method (above), corpus_init and corpus choose the
        # inputs, generic and corpus hold each phase's budget (below)
        schema_flags(
            config,
            SCHEMA,
            "pretrain.mae",
            passed_otherwise=(
                "p_dec",
                "use_projection",
                "corpus_init",
                "generic",
                "corpus",
            ),
        ),
        # the corpus phase's documents choose its input (corpus_stage_corpus)
        schema_flags(
            config, SCHEMA, f"pretrain.mae.{phase}", passed_otherwise=("documents",)
        ),
        training_flags(config, SCHEMA),
    ]
    pmi = (
        mae_generic_pmi(wildcards) if phase == "generic" else mae_corpus_pmi(wildcards)
    )
    for path in pmi:
        flags.append(f"--pmi {shlex.quote(path)}")
    for path in qac_queries_input(wildcards) if phase == "corpus" else []:
        flags.append(f"--queries {shlex.quote(path)}")
    if phase == "generic":
        flags.append(generic_corpus_flags(PT))
    tokens = (
        mae_generic_tokens(wildcards)
        if phase == "generic"
        else mae_corpus_tokens(wildcards)
    )
    for path in tokens:
        flags.append(f"--tokens {shlex.quote(path)}")
    return " ".join(flags)


def contriever_corpus_input(wildcards):
    """What Contriever pre-trains on: the collection's documents, or with pretrain.contriever.corpus
    generic the generic corpus (Contriever Appendix A: Wikipedia, or Wikipedia and CCNet).
    """
    if PT["contriever"]["corpus"] == "generic":
        return generic_corpus_input(wildcards)
    return [result_path(wildcards.collection, "passages.parquet")]


def contriever_corpus_flags(wildcards):
    if PT["contriever"]["corpus"] == "generic":
        return generic_corpus_flags(PT)
    return f"--passages {shlex.quote(contriever_corpus_input(wildcards)[0])}"


def pretrain_contriever_flags(wildcards):
    contriever = schema_flags(
        config, SCHEMA, "pretrain.contriever", passed_otherwise=("corpus",)
    )
    return (
        f"{contriever_corpus_flags(wildcards)} --seed {q(FT['seed'])}"
        f" {contriever} {training_flags(config, SCHEMA)}"
    )
