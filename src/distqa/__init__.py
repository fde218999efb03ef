"""distqa: multi-node DistributedDataParallel training of a BERT-family question-answering model.

What a fork may import is :mod:`distqa.tasks` (docs/FORKING.md, "What a fork imports"). A module that moved keeps
its old name for one release (``MOVED``, CHANGELOG.md): importing it warns once with the name to write instead.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

__version__ = "0.2.0"

MOVED = {
    "distqa.errors": "distqa.config.errors",
    "distqa.atomic_files": "distqa.checkpoint.files",
    "distqa.launch.elastic": "distqa.distributed.elastic",
    "distqa.launch.node_checks": "distqa.launch.node",
    "distqa.settings": "distqa.config",
    "distqa.settings.flags": "distqa.config.flags",
    "distqa.settings.presets": "distqa.config.presets",
    "distqa.settings.sources": "distqa.config.sources",
    "distqa.settings.task_commands": "distqa.checkpoint.commands",
    "distqa.parallel": "distqa.distributed",
    "distqa.parallel.ddp": "distqa.distributed.ddp",
    "distqa.parallel.fsdp": "distqa.distributed.fsdp",
    "distqa.launch.preflight": "distqa.training.preflight",
}
"""Old module name -> new one, kept one release (CHANGELOG.md lists each, with the release that removes it)."""


class _MovedModule(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old name as a module whose attributes are the new module's (the same objects, so a class
    imported by either name is one class), after a DeprecationWarning naming the line to write."""

    def find_spec(self, name: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(name, self) if name in MOVED else None

    def exec_module(self, module: ModuleType) -> None:
        new_name = MOVED[module.__name__]
        warnings.warn(f"{module.__name__} moved: import from {new_name} instead (a task imports what it uses from "
                      "distqa.tasks: CHANGELOG.md)", DeprecationWarning,
                      stacklevel=2)
        new = importlib.import_module(new_name)
        # Every name read through the new module as it is (a package's __path__ too, for its old submodule names).
        module.__getattr__ = lambda attribute: getattr(new, attribute)


# First on the path: a leftover copy of an old module (an installed older distqa) must not shadow the new one.
sys.meta_path.insert(0, _MovedModule())
