def ingest_out_dir(wildcards):
    return result_path(wildcards.collection, "collection")


def ingest_inputs(wildcards):
    """BEIR files are inputs (a changed file reruns ingest); other sources have none."""
    spec = collection_spec(wildcards)
    if spec["source"] != "beir":
        return []
    root = spec["path"]
    files = [os.path.join(root, "corpus.jsonl"), os.path.join(root, "queries.jsonl")]
    files += [
        os.path.join(root, "qrels", f"{s}.tsv")
        for s in ("train", "dev", "test")
        if os.path.exists(os.path.join(root, "qrels", f"{s}.tsv"))
    ]
    return files


def ingest_flags(wildcards):
    spec = collection_spec(wildcards)
    flags = [f"--source {q(spec['source'])}"]
    if spec["source"] == "embedded" and spec.get("max_documents") is not None:
        flags.append(f"--max-documents {q(spec['max_documents'])}")
    if spec["source"] == "embedded":
        share = spec["split_percent"]
        flags.append(
            f"--split-percent {q(share['train'])} {q(share['dev'])} {q(share['test'])}"
        )
    if spec["source"] == "beir":
        flags.append(f"--path {shlex.quote(spec['path'])}")
    if spec["source"] == "ir_datasets":
        flags.append(f"--ir-datasets {shlex.quote(json.dumps(spec['ir_datasets']))}")
    return " ".join(flags)
