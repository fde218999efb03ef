"""The QA tasks' scripts use the launchers' shared helpers (scripts/common.sh): the Kaggle download reads .env as
every script does, and the synthetic runs share one option parser (the helpers themselves:
tests/launchers/test_launchers.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from support.processes import clean_env
from support.repo import REPO_ROOT


def test_the_kaggle_download_reads_env_comments_like_everyone_else(tmp_path: Path) -> None:
    """download_nq.sh had its own .env reader that kept trailing comments in KAGGLE_KEY."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    seen = tmp_path / "seen"
    kaggle = bin_dir / "kaggle"  # a stand-in that records the credentials it was given, then fails
    kaggle.write_text(f'#!/bin/sh\necho "$KAGGLE_USERNAME:$KAGGLE_KEY" > {seen}\nexit 1\n')
    kaggle.chmod(0o755)
    env_file = tmp_path / ".env"
    env_file.write_text("KAGGLE_USERNAME=someone   # the account\nKAGGLE_KEY=0123abcd  # from kaggle.com/settings\n")
    env = clean_env(PATH=f"{bin_dir}:/usr/bin:/bin")
    env.pop("KAGGLE_USERNAME", None)
    env.pop("KAGGLE_KEY", None)
    subprocess.run(["bash", str(REPO_ROOT / "scripts" / "download_nq.sh"), "--dir", str(tmp_path / "nq"),
                    "--env-file", str(env_file)], env=env, capture_output=True, text=True, timeout=60)
    assert seen.read_text().strip() == "someone:0123abcd"


@pytest.mark.parametrize(("script", "cache_flag"), [("train_synthetic_nq.sh", "--nq-cache-dir"),
                                                    ("train_synthetic_squad.sh", "--squad-cache-dir")])
def test_the_synthetic_run_scripts_share_one_option_parser(script: str, cache_flag: str) -> None:
    """common.sh's parse_synthetic_run_args: each option, what follows `--`, a missing value, the caller's --help."""
    parsed = subprocess.run(
        ["bash", "-c", 'source scripts/common.sh; data_dir=D; run_id=R; output_dir=O; cache_dir=; '
         f'parse_synthetic_run_args {cache_flag} "$@"; '
         'echo "$data_dir|$run_id|$output_dir|$cache_dir|${trainer_args[*]}"',
         "bash", "--run-id", "x", cache_flag, "c", "--output-dir", "o", "--", "--max-steps", "3"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    assert parsed.stdout == "D|x|o|c|--max-steps 3\n", parsed.stderr

    for args, code, said in [([cache_flag], 2, f"{script}: {cache_flag} needs a value"),
                             (["--data-dir", ""], 2, f"{script}: --data-dir needs a value"),
                             (["--help"], 0, "Usage:")]:
        result = subprocess.run(["bash", f"scripts/{script}", *args], cwd=REPO_ROOT, env=clean_env(),
                                capture_output=True, text=True, timeout=30)
        assert result.returncode == code and said in result.stdout + result.stderr, (args, result.stderr)
    assert f"[{cache_flag} DIR]" in result.stdout  # the help is the calling script's own header
