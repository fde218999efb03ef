"""The QA tasks' tests' fixture (tests/qa/ is a package, so that this file is ``qa.conftest``, not a second top-level
``conftest``); their helpers are tests/support/qa.py and tests/support/nq_examples.py."""

from __future__ import annotations

import pytest

from distqa.encoders.tiny import FAMILIES as ENCODER_FAMILIES

from support.qa import TinyEncoder, tiny_encoder_of


@pytest.fixture(scope="session", params=list(ENCODER_FAMILIES))
def tiny_encoder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> TinyEncoder:
    """Each encoder family of ``distqa.encoders.tiny`` in turn (``support.qa.tiny_encoder_of``): a test that takes this
    fixture runs once per family (``tests/qa/test_encoders.py``; a task's featurisation adds its own)."""
    return tiny_encoder_of(request.param, tmp_path_factory)
