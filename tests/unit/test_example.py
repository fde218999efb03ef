"""The worked example of a fork's task (examples/text_classification): its committed data is what its generator
writes, and bad data is reported in one line (its runs: tests/distributed/test_example.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support.processes import clean_env
from support.repo import EXAMPLE, REPO_ROOT
from support.repo import EXAMPLE_PRESET as PRESET


def test_the_committed_data_is_what_the_generator_writes(tmp_path: Path) -> None:
    written = tmp_path / "reviews.tsv"
    subprocess.run([sys.executable, "-m", "examples.text_classification.make_data", "--output", str(written)],
                   cwd=REPO_ROOT, env=clean_env(), check=True, capture_output=True, timeout=60)
    assert written.read_bytes() == (EXAMPLE / "reviews.tsv").read_bytes()


@pytest.mark.parametrize(("line", "said"), [("positive no tab here", "expected LABEL<TAB>TEXT"),
                                            ("\tno label", "expected LABEL<TAB>TEXT")])
def test_a_bad_data_line_is_one_line_naming_the_file_and_line(line: str, said: str, tmp_path: Path) -> None:
    data = tmp_path / "reviews.tsv"
    data.write_text((EXAMPLE / "reviews.tsv").read_text() + line + "\n")
    result = subprocess.run([sys.executable, "-m", "distqa.train", "--preset", PRESET, "--data-file", str(data),
                             "--output-dir", str(tmp_path)], cwd=REPO_ROOT, env=clean_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"distqa.train: data error: {data}:1201: {said}, got "
                                                  f"{line[:60]!r}; fix or remove the line."]
