"""The QA tasks' tests (template.toml's part qa). A package, so that its conftest.py and helpers import as
``qa.conftest`` and ``qa.qa_helpers``: a second top-level ``conftest`` module would replace tests/conftest.py's for
every ``from conftest import ...`` collected after it."""
