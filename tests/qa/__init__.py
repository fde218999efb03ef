"""The QA tasks' tests (template.toml's part qa). A package, so that its conftest.py imports as ``qa.conftest``: a
second top-level ``conftest`` module would replace tests/conftest.py's."""
