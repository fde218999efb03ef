"""The distributed tier's hook: every test collected under tests/distributed/ is marked ``distributed`` by its folder
(``make test-fast`` leaves them out). Its launch helpers and shared runs are tests/support/runs.py and
tests/support/shared_runs.py."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/distributed/ is marked ``distributed`` by its folder (before ``-m`` selects): it starts
    real multi-process torchrun/gloo runs. tests/unit/test_structure.py checks that no other tier is marked so."""
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.distributed)
