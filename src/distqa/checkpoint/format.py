"""Checkpoints: what they hold (one typed, versioned schema), atomic save, verification, load.

A checkpoint is one ``torch.save`` file ``<run dir>/checkpoints/step-00000100.pt`` holding plain
tensors and Python containers, so it loads with ``weights_only=True`` (no pickled code runs).
It is written to a temporary name, flushed to disk and renamed: a job killed mid-write leaves the
previous checkpoint intact and never a truncated file under a real name. A full disk fails the write
with :class:`~distqa.config.errors.DiskFullError` (folder and free space named), the previous file intact.
The trainer writes through :mod:`distqa.checkpoint.writer` (rank 0, in the background, from a host copy
of the step's state). With ``checkpoint_format = sharded`` a step checkpoint is a directory
``step-00000100.dcp/`` of every rank's shards (:mod:`distqa.checkpoint.sharded`); listing, pruning and the
newest intact checkpoint take both kinds in step order, a directory verified against its manifest.

Integrity: next to every checkpoint, ``step-00000100.pt.crc32`` (JSON) holds the size and CRC-32 of
its bytes, computed while they are written (no second pass). Loading compares the size first (a file
truncated by a full disk or a copy that stopped is caught without reading it), then the CRC-32 (bit
rot), computed while the file is read into memory, which is the one read of it (:func:`read_checkpoint`;
about 2.5 GB/s of CRC on one core). A sidecar
rather than a hash inside the file: ``torch.save``'s zip archive has no room for a checksum of
itself, and a sidecar can be checked without unpickling anything. A checkpoint without its sidecar
(an older release's, or a kill between the two renames) is loaded unverified; torch's zip reader
still refuses a truncated file. :func:`newest_intact_checkpoint` is what auto-resume uses: a damaged
newest checkpoint is reported in one line, renamed ``*.corrupt`` and the previous one used.

Two kinds, one schema: :class:`ModelCheckpoint` is ``best.pt`` (the model with the best validation
metric so far, its config and its task's inference state: what ``predict`` needs), and
:class:`TrainingCheckpoint` adds what resuming needs (optimizer, scheduler, scaler, every rank's RNG
state). The schema knows no task: which metric is best (name, direction, value) is in :class:`Progress`,
and the task's inference state (a QA task's: its decoding thresholds) is stored as the task gave it. Both carry
:data:`FORMAT_VERSION`. A file of another version is refused with a message that says so and what to do,
instead of failing somewhere in ``load_state_dict``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import mmap
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

import torch

from distqa.checkpoint.files import Digest, atomic_write, claimed, file_digest, manifest_problem, read_with_digest

log = logging.getLogger(__name__)
FORMAT_VERSION = 3
"""Version of the checkpoint layout below; raise it whenever a field is added, removed or changes meaning.
1: the unversioned layout of the first releases (no ``format_version`` key), refused.
2: the QA-only layout before the task seam (``decoding``, ``progress.best_micro_f1``, ``config.dataset``), refused
(:data:`FORMAT_2_REFUSED`: distqa 0.1 migrated it on load; 0.2.0 removed the migration)."""
FORMAT_2_REFUSED = ("{path} is a checkpoint of format 2, written by distqa before 0.2.0 (before the task seam), which "
                    "this distqa no longer reads: with distqa 0.1, which migrates it, load it "
                    "(distqa.checkpoint.format.load_checkpoint) and save it again (.save(new_path)), or train anew "
                    "(--resume none).")
"""What loading a format-2 file says (one line, the file named; :func:`parse_checkpoint`)."""


class CheckpointError(ValueError):
    """A file is not a checkpoint this version can use; the message names the file and the fix."""


@dataclass
class Progress:
    step: int = 0
    """Optimizer steps completed."""
    epoch: int = 0
    """Current pass over the data (0-based)."""
    samples_in_epoch: int = 0
    """Examples the whole job consumed in the current epoch (a multiple of the global batch)."""
    best_metric: str | None = None
    """The evaluation metric that picks checkpoints/best.pt (the task's evaluator names it); None before any."""
    best_mode: str | None = None
    """Whether higher ('max') or lower ('min') values of it are better."""
    best_value: float | None = None
    """Its value for best.pt, the best evaluation so far."""
    evaluations_without_improvement: int = 0
    """Evaluations in a row that did not beat the best by more than early_stopping_min_delta (early stopping)."""
    tracking_run_id: str | None = None
    """The MLflow run this training run logs into (``--tracker mlflow``): a resumed run goes on in it."""
    pruned_at: int = 0
    """The step at whose evaluation a sweep's pruner stopped this trial (``--sweep-trial``); 0: not pruned."""
    seeds_per_step: bool = False
    """Each step seeds the generators from (seed, step, rank) (distqa.distributed.rng.seed_for_step); False: a run
    begun before."""


@dataclass(kw_only=True)
class ModelCheckpoint:
    """``best.pt``: a trained model and what inference needs to use it."""

    model: dict[str, torch.Tensor]  # the task model's state_dict, unwrapped (no DDP ``module.`` prefix)
    config: dict[str, Any]  # the resolved training config (Config.to_dict(); its task names the task)
    task_state: dict[str, Any] | None
    """What the task's inference needs, from the latest evaluation (``Evaluation.state``); None before any."""
    evaluation: dict[str, Any] | None
    """Step and validation metrics of the latest evaluation; None before any."""
    progress: Progress
    versions: dict[str, str | None]
    """Library versions that wrote the file (``distqa.record.rundir.versions()``)."""

    def to_state(self) -> dict[str, Any]:
        """The plain dict that is saved (loads with ``weights_only=True``)."""
        state: dict[str, Any] = {"format_version": FORMAT_VERSION}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            state[f.name] = asdict(value) if isinstance(value, Progress) else value
        return state

    @classmethod
    def from_state(cls: type[C], state: Mapping[str, Any]) -> C:
        values = {f.name: state[f.name] for f in dataclasses.fields(cls)}
        values["progress"] = Progress(**values["progress"])
        return cls(**values)

    def save(self, path: Path, once: bool = False) -> bool:
        """False when another writer holds ``path``, or with ``once`` has written it (:func:`save_checkpoint`)."""
        return save_checkpoint(self.to_state(), path, once)


@dataclass(kw_only=True)
class TrainingCheckpoint(ModelCheckpoint):
    """``step-*.pt``: everything a resumed run needs to continue exactly."""

    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    scaler: dict[str, Any]
    rng: list[dict[str, Any] | None]
    """Every rank's random generators in rank order (distqa.distributed.rng); None where the save had none
    (distqa.training.peer_loss)."""
    world_size: int
    saved_by_rank: int


C = TypeVar("C", bound=ModelCheckpoint)


def digest_path(path: Path) -> Path:
    """The sidecar holding ``path``'s size and CRC-32."""
    return path.with_name(path.name + ".crc32")


def save_checkpoint(state: Mapping[str, Any], path: Path, once: bool = False) -> bool:
    """``torch.save`` through :func:`~.files.atomic_write`, then its sidecar (the old sidecar goes first:
    a kill between the renames leaves a complete checkpoint loaded unverified, never a sidecar that does not match it).
    False, writing nothing, while another writer holds the path (:func:`~.files.claimed`): rank 0's write
    and a survivor's save after a lost peer (distqa.training.peer_loss) never interleave their files and sidecars.
    With ``once`` (a survivor's save, which others may make too), also False where the claim finds the file written
    and intact: a writer that released the claim just before this one took it has saved it already."""
    with claimed(path) as ours:
        if not ours or (once and path.is_file() and verify_checkpoint(path)):
            return False
        digest_path(path).unlink(missing_ok=True)
        digest = atomic_write(path, lambda f: torch.save(dict(state), f))
        text = json.dumps({"size": digest.size, "crc32": digest.crc32}) + "\n"
        atomic_write(digest_path(path), lambda f: f.write(text.encode()))
    return True


def verify_checkpoint(path: Path) -> bool:
    """Raise :class:`CheckpointError` naming the file when its bytes differ from those written (size
    first, then CRC-32); True when verified, False when there is no sidecar to verify against."""
    expected = _sidecar_digest(path)
    if expected is None:
        return False
    _check_size(path, expected)
    _check_digest(path, file_digest(path), expected)
    return True


def read_checkpoint(path: Path, verify: bool = True) -> mmap.mmap:
    """The bytes of a checkpoint file in memory, read once (one open, one pass; :func:`parse_checkpoint`
    loads them); with ``verify``, the size is compared with the sidecar's before reading and the CRC-32,
    computed in the same pass, after. Raises :class:`CheckpointError` naming the file. Close it when done."""
    expected = _sidecar_digest(path) if verify else None
    if expected is not None:
        _check_size(path, expected)  # a truncated file is refused without reading it
    try:
        data, actual = read_with_digest(path)
    except OSError as err:
        raise CheckpointError(f"{path} cannot be read ({err}).") from err
    if expected is not None:
        try:
            _check_digest(path, actual, expected)
        except CheckpointError:
            data.close()
            raise
    return data


def _sidecar_digest(path: Path) -> Digest | None:
    """What the sidecar says was written; None when there is no sidecar."""
    sidecar = digest_path(path)
    try:
        return Digest(**json.loads(sidecar.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as err:
        raise CheckpointError(f"{sidecar} is unreadable ({err}); cannot verify {path}.") from err


def _check_size(path: Path, expected: Digest) -> None:
    try:
        size = path.stat().st_size
    except OSError as err:
        raise CheckpointError(f"{path} cannot be read ({err}).") from err
    if size != expected.size:
        raise CheckpointError(f"{path} is truncated or damaged: {size} bytes, {expected.size} were written.")


def _check_digest(path: Path, actual: Digest, expected: Digest) -> None:
    if actual.size != expected.size:
        raise CheckpointError(f"{path} is truncated or damaged: {actual.size} bytes, {expected.size} were written.")
    if actual.crc32 != expected.crc32:
        raise CheckpointError(f"{path} is corrupted: CRC-32 {actual.crc32:08x}, {expected.crc32:08x} was written.")


STATE_FILE = "state.pt"
"""In a sharded checkpoint's directory (:mod:`distqa.checkpoint.sharded`): rank 0's part, all but the weights."""
MANIFEST = "manifest.json"
"""In a sharded checkpoint's directory: every other file's size and CRC-32, written last."""
SHARDED = "sharded_checkpoint"
"""The key of the reference a sharded checkpoint's ``model`` and ``optimizer`` hold once read: its directory."""


def is_sharded_checkpoint(path: Path) -> bool:
    return path.is_dir() and (path / STATE_FILE).is_file()


def sharded_directory(state: Mapping[str, Any]) -> Path | None:
    """The directory whose shards hold ``state`` (a sharded checkpoint's ``model`` or ``optimizer`` as
    :func:`read_sharded` leaves them); None for a state loaded whole from a file."""
    return Path(state[SHARDED]) if SHARDED in state else None


def verify_directory(directory: Path) -> None:
    """Raise :class:`CheckpointError` naming the file when a file of a sharded checkpoint differs from its manifest
    (missing, another size, another CRC-32)."""
    if (problem := manifest_problem(directory, MANIFEST)) is not None:
        raise CheckpointError(problem)


def read_sharded(directory: Path, kind: type[C] = TrainingCheckpoint, verify: bool = True) -> C:  # type: ignore[assignment]
    """The sharded checkpoint in ``directory`` as ``kind``, verified first, without its weights: ``model`` and
    ``optimizer`` hold a reference to the directory (:func:`sharded_directory`), which
    :mod:`distqa.checkpoint.sharded` loads them from."""
    if verify:
        verify_directory(directory)
    try:
        data, _ = read_with_digest(directory / STATE_FILE)
    except OSError as err:
        raise CheckpointError(f"{directory / STATE_FILE} cannot be read ({err}).") from err
    try:
        checkpoint = parse_checkpoint(data, directory, kind)
    finally:
        data.close()
    checkpoint.model = {SHARDED: str(directory)}
    if isinstance(checkpoint, TrainingCheckpoint):
        checkpoint.optimizer = {SHARDED: str(directory)}
    return checkpoint


def load_checkpoint(path: Path, kind: type[C] = TrainingCheckpoint, verify: bool = True) -> C:  # type: ignore[assignment]
    """Load on the CPU as ``kind`` (a step checkpoint also loads as a :class:`ModelCheckpoint`), reading the
    file once; raises :class:`CheckpointError` naming the file when it is damaged (:func:`read_checkpoint`,
    verified unless ``verify`` is false because another rank has just verified it) or not a checkpoint of
    this recipe and version."""
    data = read_checkpoint(path, verify)
    try:
        return parse_checkpoint(data, path, kind)
    finally:
        data.close()


def parse_checkpoint(data: IO[bytes] | mmap.mmap, path: Path | str, kind: type[C] = TrainingCheckpoint) -> C:  # type: ignore[assignment]
    """The checkpoint in ``data`` (the bytes of the file ``path``, which messages name) as ``kind``; the
    tensors are copied out, so ``data`` may be closed after."""
    data.seek(0)
    try:
        state = torch.load(data, map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(f"{path} is not a readable checkpoint ({type(err).__name__}: {err}); "
                              "pass another file or --resume none.") from err
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a checkpoint of distqa.train.")
    if state.get("format_version") == 2:  # before the fields below, which it lacks: the line names what to do
        raise CheckpointError(FORMAT_2_REFUSED.format(path=path))
    missing = {f.name for f in dataclasses.fields(kind)} - set(state)
    if missing:
        is_model = {f.name for f in dataclasses.fields(ModelCheckpoint)} <= set(state)
        written_by = ("it holds no training state (best.pt does not: resume from a step-*.pt)"
                      if is_model else "it was not written by distqa.train")
        raise CheckpointError(f"{path} is missing {sorted(missing)}; {written_by}.")
    version = state.get("format_version", 1)
    if version != FORMAT_VERSION:
        age = "an older" if isinstance(version, int) and version < FORMAT_VERSION else "a newer"
        raise CheckpointError(
            f"{path} has checkpoint format version {version}, written by {age} distqa "
            f"({(state.get('versions') or {}).get('distqa', 'version unknown')}); this one reads version "
            f"{FORMAT_VERSION}. Use the distqa version that wrote it, or train anew "
            "(--resume none).")
    return kind.from_state(state)


def why_it_ends(progress: Progress, early: bool, min_delta: float) -> str:
    """The line a run logs where it ends before its last step on its own: a sweep's pruner, early stopping, or
    stop_at_step."""
    if progress.pruned_at:
        return f"pruned at step {progress.step}: the sweep's rule finds this trial behind the others there"
    if early:
        return (f"early stopping at step {progress.step}: {progress.evaluations_without_improvement} evaluations "
                f"without an improvement of {progress.best_metric} by more than {min_delta:g} (best "
                f"{progress.best_value:.4g})")
    return f"stop_at_step={progress.step} reached; resume with --resume auto"
