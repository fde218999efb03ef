"""``fork.toml``: which template a fork follows, the template commit its template-owned files equal, and the parts
it left out. ``make new-fork`` writes it and every ``make update-template`` rewrites it (as copier's answers file)."""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path

from distqa.upkeep.git import UpkeepError

RECORD = "fork.toml"


@dataclass(frozen=True)
class ForkRecord:
    upstream: str
    """The template's repository: a URL or a path, as ``git fetch`` takes it."""
    commit: str
    """The template commit this fork's template-owned files equal."""
    left_out: tuple[str, ...]
    """The parts this fork left out (template.toml); an update brings nothing of them."""

    @classmethod
    def read(cls, root: Path) -> ForkRecord | None:
        """The record of the fork at ``root`` (None: no fork.toml, so a fork from before the record, or no fork)."""
        path = root / RECORD
        if not path.is_file():
            return None
        try:
            raw = tomllib.loads(path.read_text())
            return cls(str(raw["upstream"]), str(raw["commit"]), tuple(raw.get("left_out", ())))
        except (tomllib.TOMLDecodeError, KeyError) as err:
            raise UpkeepError(f"{RECORD}: unreadable ({err!r}); restore it from git (git checkout -- {RECORD}).") \
                from err

    def write(self, root: Path) -> None:
        left_out = ", ".join(json.dumps(name) for name in self.left_out)
        (root / RECORD).write_text(
            "# Written by `make new-fork` and `make update-template` (docs/FORKING.md): the template this fork\n"
            "# follows.\n"
            "# `upstream` may be edited (the template moved); the rest is the upkeep's.\n"
            f"upstream = {json.dumps(self.upstream)}\n"
            "# The template commit that this fork's template-owned files equal.\n"
            f"commit = {json.dumps(self.commit)}\n"
            "# The parts of template.toml this fork left out: no update brings anything of them.\n"
            f"left_out = [{left_out}]\n")
