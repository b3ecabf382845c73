"""The workflow through a real (one-node) Slurm cluster with profiles/slurm-ci.

One Snakemake run submits a small BEIR collection's first two stages (ingest, split_passages) as
Slurm jobs, plus a collection whose ingest fails on purpose (a broken corpus.jsonl); --keep-going
lets the good chain finish. Then:
- the passages equal those of the same target run locally in another folder;
- the run failed (non-zero exit) and its output names the failing rule.

Brings Slurm up with scripts/slurm/start_local_slurm.sh (root, apt) when sbatch/sinfo are
missing or the node is down; skips with the reason when it cannot. The plugin polls job status
at growing intervals (2 s, then about 12 s and 22 s more), so each job of a chain costs about
35 s whatever its work: the chain is kept to two jobs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from local_inputs import beir_folder

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
TINY = ROOT / "tests" / "data" / "tiny_workflow.yaml"
START = ROOT / "scripts" / "slurm" / "start_local_slurm.sh"
PROFILE = ROOT / "profiles" / "slurm-ci"
TARGET = "results/tiny/passages.parquet"
BROKEN_TARGET = "results/broken/collection/documents.parquet"


def _env() -> dict[str, str]:
    # As in an activated venv: Slurm jobs inherit this environment (sbatch --export=ALL), so they
    # find this interpreter's snakemake and dprflow's dependencies.
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def _node_ready() -> bool:
    if not (shutil.which("sbatch") and shutil.which("sinfo")):
        return False
    state = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=30)
    return state.returncode == 0 and any(s in ("idle", "mix", "alloc") for s in state.stdout.split())


@pytest.fixture(scope="module")
def slurm_cluster():
    """Start the local cluster (idempotent) or skip, saying why."""
    if os.geteuid() == 0 and shutil.which("apt-get"):
        started = time.monotonic()
        result = subprocess.run(["bash", str(START)], capture_output=True, text=True, timeout=900)
        print(result.stdout[-2000:])
        print(f"start_local_slurm.sh: {time.monotonic() - started:.1f}s")
        if result.returncode != 0 and not _node_ready():
            pytest.skip(f"start_local_slurm.sh could not bring Slurm up:\n{result.stderr[-2000:]}")
    if not _node_ready():
        reason = (
            "no sbatch/sinfo and cannot install Slurm here (needs root and apt-get)"
            if not shutil.which("sbatch")
            else "Slurm is installed but no node is idle; run scripts/slurm/start_local_slurm.sh as root"
        )
        print(f"SKIP: {reason}")
        pytest.skip(reason)


def _snakemake(workdir: Path, config: Path, *args: str) -> subprocess.Popen:
    cmd = [
        SNAKEMAKE,
        "-s",
        str(ROOT / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(config),
        *args,
    ]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())


def _finish(proc: subprocess.Popen, timeout: float = 900) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


@pytest.fixture(scope="module")
def runs(slurm_cluster, tmp_path_factory):
    """The Slurm run (good target + broken target) and the local run of the good target."""
    slurm_dir = tmp_path_factory.mktemp("slurm")
    local_dir = tmp_path_factory.mktemp("local")

    # A second collection whose ingest job fails: its corpus is not JSON.
    beir = slurm_dir / "broken_beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text("this is not json\n")
    (beir / "queries.jsonl").write_text('{"_id": "q1", "text": "a query"}\n')
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    # A training split too, so the config passes the checks made when the DAG is built and the
    # failure happens where this test wants it: in the ingest job on the cluster.
    (beir / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    config = yaml.safe_load(TINY.read_text())
    # The good collection is a small BEIR folder rather than the tiny config's embedded one, whose
    # ingest parses the whole standard library (6 s of CPU in each of the two runs).
    good = {"source": "beir", "path": str(beir_folder(slurm_dir / "beir"))}
    config["collections"]["tiny"] = {**good, "eval_split": "test", "train_split": "train"}
    local_config = local_dir / "config.yaml"
    local_config.write_text(yaml.safe_dump(config))
    config["collections"]["broken"] = {"source": "beir", "path": str(beir)}
    slurm_config = slurm_dir / "config.yaml"
    slurm_config.write_text(yaml.safe_dump(config))

    started = time.monotonic()
    # The local run shares the 2 cores with the Slurm jobs, but mostly overlaps the plugin's
    # waits between status checks.
    local = _snakemake(local_dir, local_config, "--cores", "2", TARGET)
    slurm = _snakemake(
        slurm_dir,
        slurm_config,
        "--profile",
        str(PROFILE),
        "--executor",
        "slurm",
        "--keep-going",
        TARGET,
        BROKEN_TARGET,
    )
    slurm_rc, slurm_out = _finish(slurm)
    slurm_s = time.monotonic() - started
    local_rc, local_out = _finish(local)
    print(f"slurm run: {slurm_s:.1f}s (exit {slurm_rc}); both runs: {time.monotonic() - started:.1f}s")
    assert local_rc == 0, local_out[-4000:]
    return {"dir": slurm_dir, "rc": slurm_rc, "out": slurm_out, "local_dir": local_dir}


def test_slurm_run_matches_the_local_run(runs):
    slurm_passages = runs["dir"] / TARGET
    assert slurm_passages.exists(), runs["out"][-6000:]
    # Every job of the chain went through sbatch.
    assert "has been submitted with SLURM jobid" in runs["out"]
    for rule in ("ingest", "split_passages"):
        assert (runs["dir"] / ".snakemake" / "slurm_logs" / f"rule_{rule}").is_dir(), rule
    slurm = pd.read_parquet(slurm_passages)
    local = pd.read_parquet(runs["local_dir"] / TARGET)
    assert len(slurm) > 0
    pd.testing.assert_frame_equal(slurm, local)


def test_a_failing_job_fails_the_run_and_names_its_rule(runs):
    assert runs["rc"] != 0, runs["out"][-4000:]
    assert "Error in rule ingest" in runs["out"], runs["out"][-4000:]
    assert "collection=broken" in runs["out"]
    assert not (runs["dir"] / BROKEN_TARGET).exists()


def _start(cpus: set[int] | None = None, **env: str) -> tuple[str, list[str]]:
    """Run the start script on the CPUs ``cpus`` (default: this process's) with ``env`` added; its
    output and the node's CPUs and state."""
    result = subprocess.run(
        ["bash", str(START)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **env},
        preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    node = subprocess.run(["sinfo", "-h", "-N", "-o", "%c %t"], capture_output=True, text=True, timeout=30)
    return result.stdout, node.stdout.split()


@pytest.mark.skipif(os.geteuid() != 0, reason="the script changes the cluster only as root")
def test_the_node_gets_every_cpu_and_a_changed_node_restarts_the_daemons(runs):
    """nproc also obeys OMP_NUM_THREADS, which `make test` sets to 1 in each pytest process: the
    node still gets every CPU the script may use. A changed CPU count is a change of node that
    `scontrol reconfigure` refuses: the script restarts the daemons, and the node comes back idle
    with the new count. Runs after the Slurm run (``runs``): a restart forgets the cluster's jobs."""
    cpus = os.sched_getaffinity(0)
    if len(cpus) < 2:
        pytest.skip("one CPU: no other CPU count to change the node to")
    out, node = _start({min(cpus)})
    assert "restarting slurmctld and slurmd" in out and node == ["1", "idle"], (out, node)
    out, node = _start(OMP_NUM_THREADS="1")  # every CPU again, whatever OMP_NUM_THREADS says
    assert "restarting slurmctld and slurmd" in out and node == [str(len(cpus)), "idle"], (out, node)
    out, node = _start()  # as the first pytest process runs it, without OMP_NUM_THREADS: no change
    assert "restarting" not in out and node == [str(len(cpus)), "idle"], (out, node)


@pytest.mark.skipif(os.geteuid() != 0, reason="the script stops at once without root")
def test_the_start_script_leaves_a_real_clusters_config_alone(tmp_path):
    """A slurm.conf the script did not write is a real cluster's: it stops before installing or
    writing anything, naming the file."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=real\nSlurmctldHost=head01\n")
    result = subprocess.run(
        ["bash", str(START)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SLURM_CONF": str(conf)},
    )
    assert result.returncode == 1
    assert f"{conf} was not written by this script" in result.stderr
    assert "installing" not in result.stdout and "packages ready" not in result.stdout
    assert conf.read_text() == "ClusterName=real\nSlurmctldHost=head01\n"
