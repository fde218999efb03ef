"""`--task nq` end to end: prepare, then DDP training from the cache; a missing cache under DDP."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from distqa.prepare import main as prepare_main
from distqa.qa.nq.synthetic import write_jsonl as write_synthetic

from support.compare import final_weights
from support.nq_examples import UNDECODABLE_LINES, random_record, write_jsonl
from support.processes import clean_env, free_port, run_prepare
from support.qa import FAST_ARGS, QA_ARGS
from support.repo import REPO_ROOT
from support.runs import run_training

pytestmark = pytest.mark.distributed


def nq_args(tmp_path: Path) -> list[str]:
    rng = random.Random(0)
    source = write_jsonl(tmp_path / "nq.jsonl", [random_record(rng, i, max_blocks=12) for i in range(160)])
    return [*QA_ARGS, "--task", "nq", "--nq-train-file", str(source), "--nq-cache-dir", str(tmp_path / "cache"),
            "--doc-stride", "24", "--negative-keep-rate", "0.3", "--num-proc", "2",
            "--output-dir", str(tmp_path / "results"), "--global-batch-size", "16", "--per-rank-batch-size", "4"]


@pytest.fixture
def prepare_here(run_main: Callable[..., tuple[int, str, str]]) -> Callable[..., tuple[int, str, str]]:
    """``python -m distqa.prepare --task nq ARGS`` as its main in this process (conftest's ``run_main``; one
    featurising process works in the caller's): the exit code, standard output, and standard error with the log."""
    return lambda *args: run_main(prepare_main, "--task", "nq", "--progress-bar", "false", *args)


def test_prepare_then_two_ranks_train_from_the_cache(tmp_path: Path) -> None:
    args = nq_args(tmp_path)
    built = run_prepare(["--only-if-needed", *args])  # the trainer's command line: prepare what it reads
    cache = Path(built.stdout.strip())
    assert (cache / "manifest.json").is_file() and "with an answer" in built.stderr
    again = run_prepare(["--only-if-needed", *args])  # unchanged settings: reused at once
    assert again.stdout == built.stdout and "reusing the NQ feature cache" in again.stderr

    result = run_training([*args, "--epochs", "2"], nproc=2)
    assert "training finished" in result.stderr
    assert final_weights(tmp_path / "results" / "local")


def test_a_missing_cache_under_ddp_fails_fast_with_the_command_to_run(tmp_path: Path) -> None:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                "-m", "distqa.train", *nq_args(tmp_path)]
    result = subprocess.run(launcher, cwd=REPO_ROOT, env=clean_env(OMP_NUM_THREADS="1"), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0
    assert "no NQ feature cache" in result.stderr and "python -m distqa.prepare" in result.stderr
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_one_process_builds_the_missing_cache_itself(tmp_path: Path) -> None:
    result = run_training([*nq_args(tmp_path), "--max-steps", "2"])
    assert "NQ feature cache ready" in result.stderr and "training finished" in result.stderr


def test_a_checkpoint_of_other_data_is_not_resumed(tmp_path: Path) -> None:
    """Same run name, other dataset: --resume auto refuses instead of continuing the wrong run."""
    args = nq_args(tmp_path)
    run_training([*FAST_ARGS, "--output-dir", str(tmp_path / "results"), "--global-batch-size", "16",
                  "--per-rank-batch-size", "4", "--max-steps", "1"])  # the same run name, on the DummyDataset
    result = subprocess.run([sys.executable, "-m", "distqa.train", *args, "--max-steps", "1"], cwd=REPO_ROOT,
                            env=clean_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "belongs to a run with other settings (task 'dummy' -> 'nq')" in result.stderr


def test_committed_sample_prepares_cleanly(tmp_path: Path, prepare_here: Callable[..., tuple[int, str, str]]) -> None:
    """The README's NQ example: the sample featurises with no bad line and every answer type."""
    code, out, err = prepare_here("--nq-cache-dir", str(tmp_path / "cache"))
    assert code == 0, err
    manifest = json.loads((Path(out.strip()) / "manifest.json").read_text())
    assert (manifest["examples"], manifest["bad_lines"]) == (200, 0)
    train = manifest["splits"]["train"]
    assert all(count > 0 for count in train["by_type"].values()) and train["positive"] > 100


def test_large_generated_file_with_long_documents(tmp_path: Path) -> None:
    """Documents past 10k tokens, several processes, then training from the cache."""
    source = tmp_path / "big.jsonl"
    stats = write_synthetic(source, 120, seed=3, min_doc_tokens=500, max_doc_tokens=3000, long_docs=6,
                            long_doc_tokens=24000)
    assert stats.max_tokens > 10_000
    args = [*QA_ARGS, "--task", "nq", "--nq-train-file", str(source), "--nq-cache-dir", str(tmp_path / "cache"),
            "--doc-stride", "24", "--negative-keep-rate", "0.05", "--num-proc", "2",
            "--output-dir", str(tmp_path / "results")]
    manifest = json.loads((Path(run_prepare(["--only-if-needed", *args]).stdout.strip()) / "manifest.json").read_text())
    assert manifest["examples"] == 120
    assert manifest["splits"]["validation"]["windows"] > 100 * manifest["splits"]["validation"]["examples"] / 10
    result = run_training([*args, "--max-steps", "3"])
    assert "NQ windows from" in result.stderr and "featurising" not in result.stderr  # the prepared cache
    assert "training finished" in result.stderr


def test_local_launcher_prepares_the_cache_before_starting_the_nodes(tmp_path: Path) -> None:
    launcher = ["bash", "scripts/run_distributed_locally.sh", "--nodes", "2", "--port", str(free_port()), "--",
                *nq_args(tmp_path), "--max-steps", "2"]
    result = subprocess.run(launcher, cwd=REPO_ROOT, env=clean_env(PYTHON=sys.executable), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr.index("NQ feature cache ready") < result.stderr.index("launching 2 node(s)")
    assert final_weights(tmp_path / "results" / "local")


def test_prepare_errors_are_one_line_messages(tmp_path: Path, prepare_here: Callable[..., tuple[int, str, str]]
                                             ) -> None:
    missing = prepare_here("--nq-train-file", str(tmp_path / "missing.jsonl"))
    assert missing[0] == 2 and "missing.jsonl: no such file" in missing[2]
    blocked = tmp_path / "a-file"
    blocked.touch()
    unwritable = prepare_here("--nq-cache-dir", str(blocked / "cache"))
    assert unwritable[0] == 1 and "check nq_cache_dir" in unwritable[2]
    for _, _, err in (missing, unwritable):
        assert "Traceback" not in err


@pytest.mark.parametrize("case", ["NUL-led", "Latin-1"])
def test_prepare_skips_or_refuses_an_undecodable_line_without_a_traceback(
        case: str, tmp_path: Path, prepare_here: Callable[..., tuple[int, str, str]]) -> None:
    rng = random.Random(0)
    records: list[dict | bytes] = [random_record(rng, i) for i in range(160)]
    source = write_jsonl(tmp_path / "nq.jsonl", [*records[:80], UNDECODABLE_LINES[case], *records[80:]])

    def run(policy: str) -> tuple[int, str, str]:  # a cache each: a built one would be reused
        return prepare_here("--nq-train-file", str(source), "--nq-cache-dir", str(tmp_path / policy),
                            "--on-bad-line", policy)

    skipped, skipped_err = run("skip")[::2]
    assert skipped == 0, skipped_err
    assert "160 examples from 161 lines (1 malformed, skipped)" in skipped_err
    assert f"{source}:81: " in skipped_err
    refused, refused_err = run("fail")[::2]
    assert refused == 2 and f"{source}:81: " in refused_err
    assert "Traceback" not in skipped_err + refused_err
