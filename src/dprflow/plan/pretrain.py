"""The pre-training rules' inputs and flags (rules/pretrain.smk), from the config (issue 53).

Every method reads its corpus from a token store (rule ``pretrain_tokenize``): a corpus tokenized
once per tokenizer and view, at ``results/<corpus>/tokens/<tokenizer key>/<view>``, where the
corpus is a collection, a ``pretrain.corpora`` name or ``pretrain`` (the generic corpus). A
:class:`PretrainPlan` answers, for a job's wildcards, which store, corpus, stage-one model and
n-gram statistics it reads and the flags of its shell line; the rules pass its bound methods as
input functions and params. The flags of each method's settings come from the schema
(:func:`dprflow.rule_flags.schema_flags`), so a key added to a section reaches its stage.

Wildcards are read by attribute (``wildcards.corpus``); a job of one rule has only some of them
(``cocondenser`` in stage two of coCondenser, ``mae`` or ``mae_method`` in the MAE's phases).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dprflow.plan import UnderResults
from dprflow.plan.methods import QAC_METHODS
from dprflow.provenance import local_sha256
from dprflow.rule_flags import generic_corpus_flags, q, schema_flags, training_flags

TOKEN_VIEWS = ("documents", "passages", "document-sentences", "texts", "text-sentences")
GENERIC = "pretrain"  # the generic corpus's name where a collection's would be


def local_paths(*values: Any) -> list[str]:
    """The settings among ``values`` that name an existing local file or folder, as inputs of the
    rules that read them (a changed or missing one then reruns or fails like any input); a hub id
    or a packaged model's name is not a path and is left out."""
    return [v for v in values if v and os.path.exists(v)]


def content_fingerprint(*values: Any) -> str:
    """The SHA-256 of each setting among ``values`` that names a local file or folder, as a param
    of the rules that read it: Snakemake reruns a job whose params changed, and a folder input
    alone does not rerun anything when a file inside it is edited (the folder's own mtime does
    not change). Hashes are kept in .snakemake/ keyed by the files' sizes and mtimes, so the
    content is read again only after a change (nothing is written beside the user's folder)."""
    return " ".join(f"{p}={local_sha256(p)}" for p in local_paths(*values))


def tokenizer_key(name: str) -> str:
    """The folder name of a tokenizer's stores: its model name or path, other characters as _."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "tokenizer"


def _has(wildcards: Any, name: str) -> bool:
    return getattr(wildcards, name, None) is not None


class PretrainPlan(UnderResults):
    """The inputs and flags of the pre-training jobs of ``config`` (validated against ``schema``),
    under ``results``; ``init_tokenizer`` is the initial model's tokenizer (model.mlm.tokenizer
    when the initial model is the MLM base trained here)."""

    def __init__(
        self, config: Mapping[str, Any], schema: str | Path, results: str, init_tokenizer: str
    ) -> None:
        self.config, self.schema, self.results = config, schema, results
        self.pt = config["pretrain"]
        self.mlm = config["model"]["mlm"]
        self.seed = config["finetune"]["seed"]
        self.init_tokenizer = init_tokenizer
        # The tokenizers stores are written with: the initial model's, stage two's given
        # Condenser's (pretrain.cocondenser.init), the MAE corpus stage's start and the MLM base's.
        names = [init_tokenizer, self.pt["cocondenser"]["init"], self.pt["mae"]["corpus_init"]]
        self.tokenizers = {tokenizer_key(n): n for n in [*names, self.mlm["tokenizer"]] if n}

    # ------------------------------------------------------------------------------ paths
    def tokens_path(self, corpus: str, view: str, tokenizer: str | None = None) -> str:
        """A token store of ``corpus`` in ``view``, written with ``tokenizer`` (default: the
        initial model's)."""
        return self.path(corpus, "tokens", tokenizer_key(tokenizer or self.init_tokenizer), view)

    def generic_corpus_input(self, wildcards: Any = None) -> list[str]:
        path = self.pt["generic_corpus"]["path"]
        return [path] if path else []

    def corpus_texts_input(self, wildcards: Any) -> list[str]:
        """What a store or an n-gram count of ``wildcards.corpus`` reads: the generic corpus's
        file, or a collection's (or corpus's) passages."""
        if wildcards.corpus == GENERIC:
            return self.generic_corpus_input()
        return [self.path(wildcards.corpus, "passages.parquet")]

    def corpus_stage_corpus(self, wildcards: Any) -> str:
        """The name whose passages a corpus-stage job reads: pretrain.cocondenser.corpus (coCondenser
        and query-as-context coCondenser) or pretrain.mae.corpus.documents (the MAEs), a corpus of
        pretrain.corpora (e.g. msmarco-document cut into passages of passages.max_tokens,
        coCondenser 4.1, query-as-context 4.1); else the collection's own."""
        if _has(wildcards, "cocondenser"):
            key, name = "pretrain.cocondenser.corpus", self.pt["cocondenser"]["corpus"]
        else:
            key, name = "pretrain.mae.corpus.documents", self.pt["mae"]["corpus"]["documents"]
        if name and name not in self.pt["corpora"]:
            raise ValueError(
                f"{key}: {name!r} is not a name of pretrain.corpora "
                f"({sorted(self.pt['corpora']) or 'none defined'})"
            )
        return name or wildcards.collection

    def corpus_stage_passages(self, wildcards: Any) -> str:
        """The passages a corpus-stage job reads: coCondenser samples span pairs from their
        documents (query-as-context pairs them with their queries), CoT-MAE joins them back into
        documents."""
        return self.path(self.corpus_stage_corpus(wildcards), "passages.parquet")

    def qac_queries_input(self, wildcards: Any) -> list[str]:
        """A query-as-context method's doc2query queries of the passages it reads; none for the
        other methods."""
        method = getattr(wildcards, "cocondenser", None) or getattr(wildcards, "mae_method", None)
        if method not in QAC_METHODS:
            return []
        return [self.path(self.corpus_stage_corpus(wildcards), "doc2query", "generated_queries.parquet")]

    # ------------------------------------------------------------------------ token stores
    def tokenizer_name(self, wildcards: Any) -> str:
        """The model name or path whose tokenizer writes a store."""
        if wildcards.tokenizer not in self.tokenizers:
            raise ValueError(
                f"token store {wildcards.tokenizer!r}: not the key of a configured tokenizer "
                f"({sorted(self.tokenizers)})"
            )
        return self.tokenizers[wildcards.tokenizer]

    def tokenizer_input(self, wildcards: Any) -> list[str]:
        """The tokenizer's folder when it is local: an input of the store's rule."""
        return local_paths(self.tokenizer_name(wildcards))

    def tokenizer_fingerprint(self, wildcards: Any) -> str:
        return content_fingerprint(self.tokenizer_name(wildcards))

    def tokenize_flags(self, wildcards: Any) -> str:
        generic = wildcards.corpus == GENERIC
        if generic != wildcards.view.startswith("text"):
            raise ValueError(
                f"token store view {wildcards.view!r} does not apply to corpus {wildcards.corpus!r} "
                "(texts and text-sentences: the generic corpus 'pretrain'; the others: passages)"
            )
        flags = f"--tokenizer {q(self.tokenizer_name(wildcards))}"
        if generic:
            flags += f" --corpus {q(self.pt['generic_corpus']['source'])}"
        for path in self.corpus_texts_input(wildcards):
            flags += f" --corpus-path {shlex.quote(path)}"
        return flags

    def condenser_tokens(self, wildcards: Any) -> str:
        return self.tokens_path(GENERIC, "texts")

    def cocondenser_tokens(self, wildcards: Any) -> str:
        """coCondenser's documents, or a query-as-context method's passages, of the corpus stage
        two reads (pretrain.cocondenser.corpus), as a store of the stage-one Condenser's tokenizer."""
        view = "passages" if wildcards.cocondenser in QAC_METHODS else "documents"
        return self.tokens_path(self.corpus_stage_corpus(wildcards), view, self.pt["cocondenser"]["init"])

    def contriever_tokens(self, wildcards: Any) -> str:
        """The collection's documents, or with pretrain.contriever.corpus generic the generic
        corpus's texts."""
        if self.pt["contriever"]["corpus"] == "generic":
            return self.tokens_path(GENERIC, "texts")
        return self.tokens_path(wildcards.collection, "documents")

    def mlm_tokens(self, wildcards: Any) -> str:
        """The generic corpus's texts as a store of the MLM base's tokenizer."""
        return self.tokens_path(GENERIC, "texts", self.mlm["tokenizer"])

    def mlm_corpus_passages(self, wildcards: Any) -> str:
        """What method mlm pre-trains on: the collection's passages, read as its documents."""
        return self.path(wildcards.collection, "passages.parquet")

    def mlm_corpus_tokens(self, wildcards: Any) -> str:
        """The collection's documents as a store of the initial model's tokenizer (method mlm)."""
        return self.tokens_path(wildcards.collection, "documents")

    def mae_generic_tokens(self, wildcards: Any) -> list[str]:
        """BMAE/CoT-MAE generic corpus store; none for CDMAE (its store holds the importance from
        the n-gram counts: the stage writes its own), nor for a generic corpus of passages (read
        as a collection's: the stage tokenizes it itself)."""
        variant = self.mae_variant(wildcards)
        if variant == "cdmae" or self.pt["generic_corpus"]["source"] == "passages":
            return []
        return [self.tokens_path(GENERIC, "text-sentences" if variant == "cotmae" else "texts")]

    def mae_corpus_tokens(self, wildcards: Any) -> list[str]:
        variant = self.mae_variant(wildcards)
        if variant == "cdmae":
            return []
        if wildcards.mae_method in QAC_METHODS:
            view = "passages"
        else:
            view = "document-sentences" if variant == "cotmae" else "passages"
        return [self.tokens_path(self.corpus_stage_corpus(wildcards), view, self.pt["mae"]["corpus_init"])]

    # ------------------------------------------------------------------ models and inputs
    def mlm_tokenizer_input(self, wildcards: Any) -> list[str]:
        """model.mlm.tokenizer when it is a local folder."""
        return local_paths(self.mlm["tokenizer"])

    def mlm_tokenizer_fingerprint(self, wildcards: Any) -> str:
        return content_fingerprint(self.mlm["tokenizer"])

    def cocondenser_init_fingerprint(self, wildcards: Any) -> str:
        """The content of a local pretrain.cocondenser.init folder (see content_fingerprint)."""
        return content_fingerprint(self.pt["cocondenser"]["init"])

    def mae_variant(self, wildcards: Any) -> str:
        """The MAE a pre-training job trains: its generic ({mae}) or corpus ({mae_method})
        wildcard; qac-cotmae is CoT-MAE with query contexts."""
        if _has(wildcards, "mae"):
            return wildcards.mae
        return QAC_METHODS.get(wildcards.mae_method, wildcards.mae_method)

    def mae_generic_model(self, wildcards: Any) -> str | list[str]:
        """The generic stage's model, an input of the corpus stage; none when
        pretrain.mae.corpus_init names the checkpoint to start from (CDMAE footnote 4: RetroMAE)."""
        if self.pt["mae"]["corpus_init"]:
            return []
        return self.path("pretrain", self.mae_variant(wildcards), "generic", "model")

    def mae_corpus_init(self, wildcards: Any) -> str:
        return self.pt["mae"]["corpus_init"] or self.mae_generic_model(wildcards)

    def contriever_corpus_input(self, wildcards: Any) -> list[str]:
        """What Contriever pre-trains on: the collection's documents, or with
        pretrain.contriever.corpus generic the generic corpus (Contriever Appendix A: Wikipedia,
        or Wikipedia and CCNet)."""
        if self.pt["contriever"]["corpus"] == "generic":
            return self.generic_corpus_input()
        return [self.path(wildcards.collection, "passages.parquet")]

    # -------------------------------------------------------------- CDMAE's n-gram counts
    def pmi_count_flags(self, wildcards: Any) -> str:
        p = self.pt["pmi"]
        source = self.pt["generic_corpus"]["source"] if wildcards.corpus == GENERIC else "passages"
        flags = (
            f"--corpus {q(source)} --shards {q(p['shards'])} --max-n {q(p['max_n'])}"
            f" --max-distinct {q(p['max_distinct'])}"
        )
        for path in self.corpus_texts_input(wildcards):
            flags += f" --corpus-path {shlex.quote(path)}"
        return flags

    def pmi_count_mem_mb(self, wildcards: Any) -> int:
        """Counting holds up to max_distinct entries of 16 bytes, twice while combining, plus a batch."""
        return 1000 + 32 * self.pt["pmi"]["max_distinct"] // 2**20

    def pmi_shard_files(self, wildcards: Any) -> list[str]:
        return [
            self.path(wildcards.corpus, "pmi", "counts", f"{s}.parquet")
            for s in range(self.pt["pmi"]["shards"])
        ]

    def _mae_pmi(self, wildcards: Any, corpus: str) -> list[str]:
        """CDMAE's n-gram statistics of the corpus pre-trained on; the other MAEs need none."""
        if self.mae_variant(wildcards) != "cdmae":
            return []
        return [self.path(corpus, "pmi", "ngram_counts.parquet")]

    def mae_generic_pmi(self, wildcards: Any) -> list[str]:
        return self._mae_pmi(wildcards, GENERIC)

    def mae_corpus_pmi(self, wildcards: Any) -> list[str]:
        return self._mae_pmi(wildcards, self.corpus_stage_corpus(wildcards))

    # ------------------------------------------------------------------------------ flags
    def _section(self, section: str, passed_otherwise: tuple[str, ...] = ()) -> str:
        return schema_flags(self.config, self.schema, section, passed_otherwise=passed_otherwise)

    def _training(self) -> str:
        return training_flags(self.config, self.schema)

    def pretrain_mlm_flags(self, wildcards: Any) -> str:
        return (
            f"{generic_corpus_flags(self.pt)} --seed {q(self.seed)}"
            f" {self._section('model.mlm')} {self._training()}"
        )

    def pretrain_mlm_corpus_flags(self, wildcards: Any) -> str:
        """Method mlm: the initial model's masked LM continued on the collection's documents
        (pretrain.mlm), its encoder written in the geometry method none uses (model.pooling and
        model.similarity where set, else the initial model's own)."""
        model = self.config["model"]
        geometry = "".join(
            f" --{key} {q(model[key])}" for key in ("pooling", "similarity") if model[key] is not None
        )
        return (
            f"--view documents --corpus passages --corpus-path {shlex.quote(self.mlm_corpus_passages(wildcards))}"
            f" --seed {q(self.seed)}{geometry} {self._section('pretrain.mlm')} {self._training()}"
        )

    def pretrain_generic_flags(self, wildcards: Any) -> str:
        return (
            f"{generic_corpus_flags(self.pt)} --seed {q(self.seed)}"
            f" {self._section('pretrain.condenser')} {self._training()}"
        )

    def pretrain_corpus_flags(self, wildcards: Any) -> str:
        """Flags of a pretrain_corpus job; a query-as-context job also reads the generated queries
        and its passages' length (query-as-context section 4.2: 144 tokens)."""
        queries = "".join(
            f" --queries {shlex.quote(p)}"
            f" --max-passage-tokens {q(self.pt['cocondenser']['qac_passage_tokens'])}"
            for p in self.qac_queries_input(wildcards)
        )
        # init and corpus choose the stage's inputs; qac_passage_tokens goes with the queries
        section = self._section("pretrain.cocondenser", ("init", "corpus", "qac_passage_tokens"))
        return f"--seed {q(self.seed)} {section}{queries} {self._training()}"

    def mae_generic_flags(self, wildcards: Any) -> str:
        return self.mae_flags(wildcards, "generic")

    def mae_corpus_flags(self, wildcards: Any) -> str:
        return self.mae_flags(wildcards, "corpus")

    def mae_flags(self, wildcards: Any, phase: str) -> str:
        """Flags of a pretrain_mae job: shared MAE settings, the method's decoder mask ratio and
        projection, the phase's budget and (generic phase) the corpus."""
        m, variant = self.pt["mae"], self.mae_variant(wildcards)
        generic = phase == "generic"
        flags = [
            f"--seed {q(self.seed)}",
            f"--p-dec {q(m['p_dec'][variant])}",
            f"--use-projection {q(str(m['use_projection'][variant]).lower())}",
            # p_dec and use_projection per method (above), corpus_init and corpus choose the
            # inputs, generic and corpus hold each phase's budget (below)
            self._section("pretrain.mae", ("p_dec", "use_projection", "corpus_init", "generic", "corpus")),
            # the corpus phase's documents choose its input (corpus_stage_corpus)
            self._section(f"pretrain.mae.{phase}", ("documents",)),
            self._training(),
        ]
        if generic:
            pmi, queries, tokens = self.mae_generic_pmi(wildcards), [], self.mae_generic_tokens(wildcards)
        else:
            pmi, queries = self.mae_corpus_pmi(wildcards), self.qac_queries_input(wildcards)
            tokens = self.mae_corpus_tokens(wildcards)
        flags += [f"--pmi {shlex.quote(path)}" for path in pmi]
        flags += [f"--queries {shlex.quote(path)}" for path in queries]
        if generic:
            flags.append(generic_corpus_flags(self.pt))
        flags += [f"--tokens {shlex.quote(path)}" for path in tokens]
        return " ".join(flags)

    def pretrain_contriever_flags(self, wildcards: Any) -> str:
        if self.pt["contriever"]["corpus"] == "generic":
            corpus = generic_corpus_flags(self.pt)
        else:
            corpus = f"--passages {shlex.quote(self.contriever_corpus_input(wildcards)[0])}"
        contriever = self._section("pretrain.contriever", ("corpus",))
        return f"{corpus} --seed {q(self.seed)} {contriever} {self._training()}"
