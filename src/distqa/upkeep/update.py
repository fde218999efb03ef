"""``make update-template``: bring the template's changes between the fork's recorded commit and REF into the fork.

Nothing is merged. Under ``template.toml`` (REF's), a template-owned file of a kept part is one the fork never
edits, so the update replaces it with REF's version; a fork-owned file is the fork's once it differs from the
template's; a left-out part's files never arrive. Every check runs before the first write, so a refusal (a dirty
tree, an edited template file, an unknown REF) changes nothing and says why in one line.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from distqa.upkeep import git
from distqa.upkeep.git import Entry, UpkeepError
from distqa.upkeep.new_fork import set_string
from distqa.upkeep.ownership import DECLARATION, Declaration
from distqa.upkeep.project import PROJECT
from distqa.upkeep.record import RECORD, ForkRecord

CHANGELOG = "CHANGELOG.md"
EDIT_MARK = "[edit]"
"""An entry that opens with it needs a change in the fork's own files (CHANGELOG.md says which and how)."""


@dataclass
class Plan:
    """What an update writes and deletes, why it would stop, and what it tells the fork."""

    writes: dict[str, Entry] = field(default_factory=dict)
    deletes: list[str] = field(default_factory=list)
    stops: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    """Template-owned files of kept parts the fork had deleted, which the update writes again."""
    texts: dict[str, bytes] = field(default_factory=dict)
    """Fork-owned files written for the fork (their first copy), in place of the template's: :func:`own_project`."""

    def summary(self) -> list[str]:
        """The notices, then one line for the restored files."""
        lines = list(self.notices)
        if self.restored:
            shown = ", ".join(self.restored[:3]) + (f" and {len(self.restored) - 3} more" if len(self.restored) > 3
                                                    else "")
            lines.append(f"restored {len(self.restored)} template-owned file(s) your fork had deleted: {shown} "
                         "(leave a part out to go without its files)")
        return lines


def plan_update(declaration: Declaration, base: dict[str, Entry], ref: dict[str, Entry], fork: dict[str, Entry],
                left_out: set[str], base_name: str, ref_name: str) -> Plan:
    """The update of a fork whose files are ``fork`` from the template at ``base`` to the template at ``ref`` (each
    path -> Entry), ``left_out`` parts aside. ``base_name`` and ``ref_name`` are how messages name the commits."""
    plan = Plan()
    for path in sorted(set(base) | set(ref)):
        placement = declaration.place(path)
        was, now, has = base.get(path), ref.get(path), fork.get(path)
        unchanged = has is not None and has == was
        if placement is None or placement.part in left_out:
            # The template no longer ships it, or its part is out: a copy the fork never changed goes.
            if unchanged:
                plan.deletes.append(path)
            elif placement is None and has is not None and was is not None:
                plan.notices.append(f"{path}: the template no longer ships it; your changed copy stays")
            continue
        if placement.template_owned:
            if was is not None and has is not None and not unchanged:
                plan.stops.append(
                    f"{path}: your fork changed this template-owned file; put the change in "
                    f"{declaration.move_hint(path)}: restore the file (git checkout {base_name} -- {path}), "
                    "run the update, then make the change there.")
            elif was is None and has is not None and has != now:
                plan.stops.append(f"{path}: the template now ships this path, which your fork has as its own file; "
                                  "rename yours, then run the update again.")
            elif was is not None and has is None and now is not None:
                plan.restored.append(path)
            if now is None:
                if has is not None:
                    plan.deletes.append(path)
            elif has != now:
                plan.writes[path] = now
        elif has is None:
            if was is None and now is not None:  # a fork-owned file the template added: its first copy
                plan.writes[path] = now
        elif unchanged:  # the fork never changed it: it follows the template
            if now is None:
                plan.deletes.append(path)
            elif now != has:
                plan.writes[path] = now
        elif was is not None and now is not None and was != now:
            plan.notices.append(f"{path}: yours; the template changed its own version "
                                f"(git diff {base_name} {ref_name} -- {path})")
    return plan


def own_project(template_text: str, fork: Mapping[str, Entry]) -> tuple[bytes, str]:
    """The first ``project.toml`` of a fork without the QA tasks (made before the file existed), and the notice that
    says so: the template's, with ``[run]`` and ``[jobs]`` args naming the fork's preset (its one preset under
    ``configs/``), else none, never the template's own QA preset, which that fork does not have."""
    presets = sorted(path[len("configs/"):-len(".toml")] for path in fork if re.fullmatch(r"configs/[^/]+\.toml", path))
    args = f"--preset {presets[0]}" if len(presets) == 1 else ""
    text = set_string(set_string(template_text, "run", "args", args), "jobs", "args", args)
    said = f"its [run] and [jobs] args are {args!r}" if args else "set its [run] and [jobs] args to your preset"
    return text.encode(), f"{PROJECT}: new, yours (docs/FORKING.md, \"What a fork sets\"); {said}"


def apply(root: Path, plan: Plan) -> None:
    """Write and delete what ``plan`` says in the fork at ``root`` (the template's blobs are fetched into it)."""
    for path in plan.deletes:
        (root / path).unlink()
        with contextlib.suppress(OSError):  # the folders it emptied, up to the first that is not (the root never is)
            os.removedirs((root / path).parent)
    for path, content in plan.texts.items():
        (root / path).write_bytes(content)
    for path, entry in plan.writes.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or target.exists():
            target.unlink()
        content = git.blob(root, entry.blob)
        if entry.mode == "120000":
            os.symlink(content.decode(), target)
        else:
            target.write_bytes(content)
            target.chmod(0o755 if entry.mode == "100755" else 0o644)


def update(root: Path, upstream: str, ref: str, target: str, base: str | None = None,
           left_out: list[str] | None = None, commit: bool = True) -> str:
    """Update the fork at ``root`` to the template commit ``target`` (``ref`` as given, from ``upstream``, fetched
    already: :func:`distqa.upkeep.__main__.hand_over`); returns what happened, in lines. ``base`` and ``left_out``
    are for a fork without fork.toml (made before the record existed): the template commit it was made from, and
    the parts it left out (``["none"]``: none)."""
    record = ForkRecord.read(root)
    if record is None and (not base or left_out is None):
        raise UpkeepError(f"no {RECORD} here: name the template commit this fork was made from and the parts it left "
                          "out (BASE=commit LEFT_OUT=\"qa notebooks\", or LEFT_OUT=none).")
    refuse_dirty(root)
    base_commit = git.resolve(root, base or record.commit, upstream)  # type: ignore[union-attr]
    raw = git.read(root, target, DECLARATION)
    if raw is None:
        raise UpkeepError(f"REF {ref!r} ({target[:12]}) has no {DECLARATION}: it predates the upkeep; "
                          "name a later one.")
    declaration = Declaration.parse(raw.decode(), f"{DECLARATION} of {target[:12]}")
    base_tree, ref_tree, fork = git.tree(root, base_commit), git.tree(root, target), git.working_files(root)
    if left_out is None:
        left_out = list(record.left_out)  # type: ignore[union-attr]
    parts_out = declaration.with_requirements(name for name in left_out if name != "none")
    plan = plan_update(declaration, base_tree, ref_tree, fork, parts_out, base_commit[:12], target[:12])
    if "qa" in parts_out and PROJECT in plan.writes and PROJECT not in base_tree and PROJECT not in fork:
        text, notice = own_project(git.blob(root, plan.writes.pop(PROJECT).blob).decode(), fork)
        plan.texts[PROJECT], plan.notices = text, [*plan.notices, notice]
    if plan.stops:
        raise UpkeepError("\n".join(plan.stops))
    apply(root, plan)
    news = changelog_between(git.read(root, base_commit, CHANGELOG), git.read(root, target, CHANGELOG))
    ForkRecord(upstream, target, tuple(sorted(parts_out))).write(root)
    parts = ", ".join(sorted(parts_out)) or "none"
    lines = [*news, *plan.summary(), f"{len(plan.writes)} file(s) written, {len(plan.deletes)} deleted: the template "
             f"from {base_commit[:12]} to {target[:12]} ({ref}), parts left out: {parts}"]
    if not git.dirty(root):
        lines.append("already up to date")
    elif commit:
        made = git.commit_all(root, f"Take the template's changes {base_commit[:12]}..{target[:12]} ({ref})\n\n"
                                    "make update-template (docs/FORKING.md)")
        lines.append(f"committed {made[:12]}")
    return "\n".join(lines)


def changelog_entries(text: bytes | None) -> list[str]:
    """The entries of a CHANGELOG.md: each ``- `` line joined with the indented lines that continue it."""
    entries: list[str] = []
    open_entry = False
    for line in (text or b"").decode().splitlines():
        if line.startswith("- "):
            entries.append(line[2:].strip())
            open_entry = True
        elif open_entry and line.startswith("  ") and line.strip():
            entries[-1] += " " + line.strip()
        else:  # a blank line, a heading or prose ends the entry
            open_entry = False
    return entries


def changelog_between(base: bytes | None, ref: bytes | None) -> list[str]:
    """What the update prints from REF's changelog: the entries the fork's template commit did not have (all of
    them for a fork made before the changelog existed), those that need an edit in the fork first."""
    known = set(changelog_entries(base))
    news = [entry for entry in changelog_entries(ref) if entry not in known]
    if not news:
        return []
    edits = [entry for entry in news if entry.startswith(EDIT_MARK)]
    header = (f"{CHANGELOG}: {len(news)} change(s) since your template commit, {len(edits)} needing an edit in "
              "your fork (marked EDIT; do it before your next run):")
    marked = [f"  EDIT {entry[len(EDIT_MARK):].strip()}" for entry in edits]
    return [header, *marked, *(f"  - {entry}" for entry in news if entry not in edits)]


def refuse_dirty(root: Path) -> None:
    changed = git.dirty(root)
    if changed:
        raise UpkeepError(f"the working tree has uncommitted changes ({len(changed)}, e.g. {changed[0]}); "
                          "commit or stash them, then run the update again.")
