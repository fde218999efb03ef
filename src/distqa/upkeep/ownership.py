"""Who owns each path: the template's declaration, ``template.toml``, read and applied.

Every path of the template belongs to a part (``core``, or one a fork may leave out: ``qa``, ``apolo``, ...) and has
an owner: the template (a fork never edits it, an update replaces it) or the fork (the template writes it when the
fork starts, never after the fork changed it). The longest pattern that matches a path places it (of two as long,
the one without a wildcard), as a routing table's longest prefix does, so a part can claim one file inside another
part's folder. Standard library only:
``make update-template`` runs the newer template's copy of this package with any Python >= 3.11, before any
environment exists.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

DECLARATION = "template.toml"
"""The declaration's path, at the top of the template and of every fork."""
CORE = "core"
"""The part every fork keeps."""
OWNERS = ("template", "fork")


class DeclarationError(ValueError):
    """The declaration is malformed: the message names the key and what to write instead."""


@dataclass(frozen=True)
class Placement:
    """Where one path belongs."""

    part: str
    owner: str
    pattern: str

    @property
    def template_owned(self) -> bool:
        return self.owner == "template"


@dataclass(frozen=True)
class Part:
    name: str
    about: str
    requires: tuple[str, ...]
    patterns: dict[str, str] = field(default_factory=dict)
    """pattern -> owner."""


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """A folder (``a/b/``: everything under it), or a glob whose ``*`` and ``?`` stay within a folder and whose
    ``**`` crosses folders; anything else is the path itself."""
    if pattern.endswith("/"):
        return re.compile(re.escape(pattern) + ".+")
    parts = re.split(r"(\*\*/?|\*|\?)", pattern)
    translated = {"**/": "(?:.+/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
    return re.compile("".join(translated.get(piece, re.escape(piece)) for piece in parts))


def specificity(placement: Placement) -> tuple[int, bool]:
    return len(placement.pattern), not any(c in placement.pattern for c in "*?")


@dataclass(frozen=True)
class Declaration:
    """``template.toml``: the parts, each pattern's owner, and where a fork moves an edit of a template file."""

    parts: dict[str, Part]
    moves: dict[str, str]

    @classmethod
    def parse(cls, text: str, source: str = DECLARATION) -> Declaration:
        """The declaration in ``text`` (the file ``source``), checked: a one-line DeclarationError names the key."""
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise DeclarationError(f"{source}: not valid TOML ({err}).") from err
        unknown = set(raw) - {"parts", "moves"}
        if unknown:
            raise DeclarationError(f"{source}: unknown key(s) {sorted(unknown)}; only [parts.NAME] and [moves].")
        if CORE not in raw.get("parts", {}):
            raise DeclarationError(f"{source}: no [parts.{CORE}]; the part every fork keeps must be declared.")
        parts: dict[str, Part] = {}
        for name, table in raw["parts"].items():
            where = f"{source}, [parts.{name}]"
            extra = set(table) - {"about", "requires", *OWNERS}
            if extra:
                raise DeclarationError(f"{where}: unknown key(s) {sorted(extra)}; use about, requires, template, fork.")
            patterns: dict[str, str] = {}
            for owner in OWNERS:
                listed = table.get(owner, [])
                if not (isinstance(listed, list) and all(isinstance(p, str) and p for p in listed)):
                    raise DeclarationError(f"{where}: {owner} must be a list of path patterns.")
                for pattern in listed:
                    if pattern in patterns:
                        raise DeclarationError(f"{where}: {pattern!r} is listed twice; keep one.")
                    patterns[pattern] = owner
            requires = tuple(table.get("requires", ()))
            parts[name] = Part(name, str(table.get("about", "")), requires, patterns)
        for part in parts.values():
            for needed in part.requires:
                if needed not in parts or needed == CORE:
                    raise DeclarationError(f"{source}, [parts.{part.name}]: requires {needed!r}, which is no "
                                           f"part a fork may leave out ({sorted(set(parts) - {CORE})}).")
        moves = raw.get("moves", {})
        if not all(isinstance(v, str) for v in moves.values()):
            raise DeclarationError(f"{source}, [moves]: each value is the text that names where an edit goes.")
        return cls(parts, dict(moves))

    @cached_property
    def _rules(self) -> list[tuple[re.Pattern[str], str, Placement]]:
        return [(pattern_regex(pattern), pattern, Placement(part.name, owner, pattern))
                for part in self.parts.values() for pattern, owner in part.patterns.items()]

    def matches(self, path: str) -> list[Placement]:
        """Every placement of ``path``, the most specific first: the longest pattern, and of two as long, the one
        without a wildcard."""
        found = [placement for regex, _, placement in self._rules if regex.fullmatch(path)]
        return sorted(found, key=specificity, reverse=True)

    def place(self, path: str) -> Placement | None:
        """Where ``path`` belongs: the placement of its longest matching pattern (None: the declaration does not
        place it, so it is not the template's: a fork's own file)."""
        found = self.matches(path)
        return found[0] if found else None

    def unplaced_or_ambiguous(self, paths: Iterable[str]) -> list[str]:
        """One line for each path that no pattern places, or that two patterns of the same length place apart."""
        problems = []
        for path in paths:
            found = self.matches(path)
            if not found:
                problems.append(f"{path}: no pattern of {DECLARATION} places it; add it to a part's template or "
                                "fork list")
            elif len(found) > 1 and specificity(found[1]) == specificity(found[0]) and found[0] != found[1]:
                problems.append(f"{path}: placed by {found[0].pattern!r} ({found[0].part}, {found[0].owner}) and "
                                f"{found[1].pattern!r} ({found[1].part}, {found[1].owner}); make one pattern longer")
        return problems

    def with_requirements(self, left_out: Iterable[str]) -> set[str]:
        """The parts left out when ``left_out`` are: those and every part that requires one of them; a one-line
        DeclarationError for a name that is no optional part."""
        names = set(left_out)
        unknown = names - set(self.parts) or names & {CORE}
        if unknown:
            raise DeclarationError(f"no part {sorted(unknown)[0]!r} to leave out; the parts a fork may leave out are "
                                   f"{sorted(set(self.parts) - {CORE})}.")
        while True:
            more = {p.name for p in self.parts.values() if set(p.requires) & names} - names
            if not more:
                return names
            names |= more

    def move_hint(self, path: str) -> str:
        """Where a fork puts the change it made to the template-owned ``path``."""
        prefixes = [key for key in self.moves if path == key or (key.endswith("/") and path.startswith(key))]
        return self.moves[max(prefixes, key=len)] if prefixes else "a file of your own"

    def table(self) -> str:
        """docs/FORKING.md's table of the parts, written from the declaration (tests/unit/test_upkeep.py compares)."""
        rows = ["| part | a fork | template-owned | fork-owned | what it is |", "|---|---|---|---|---|"]
        for part in self.parts.values():
            keeps = "keeps" if part.name == CORE else (
                "may leave out" + (f" (with {', '.join(part.requires)})" if part.requires else ""))
            listed = {owner: ", ".join(f"`{p}`" for p, o in part.patterns.items() if o == owner) or "—"
                      for owner in OWNERS}
            rows.append(f"| `{part.name}` | {keeps} | {listed['template']} | {listed['fork']} | {part.about} |")
        return "\n".join(rows)
