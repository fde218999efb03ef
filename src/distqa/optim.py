"""Where ``Precision`` was before the machinery moved into families: a task written from the example before then
imports it from here. It is :class:`distqa.distributed.Precision` (import it from there); the optimizer and its
schedule are :mod:`distqa.training.optim`. Importing this module warns once, with the line to write instead.
"""

import warnings

from distqa.distributed.precision import Precision

warnings.warn("distqa.optim moved: write `from distqa.distributed import Precision` (docs/LAYOUT.md)",
              DeprecationWarning, stacklevel=2)

__all__ = ["Precision"]
