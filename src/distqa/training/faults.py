"""Fault injection, to test a resume: a kill or a hang of one rank at one optimizer step, armed by a variable.

``INJECT_FAULT=ACTION:rank=R:step=N`` in the environment of the workers (the launchers pass their
environment on: ``INJECT_FAULT=kill:rank=1:step=30 scripts/run_distributed_locally.sh …``) makes
global rank ``R`` act right after optimizer step ``N`` (before that step is logged, evaluated or
checkpointed, so a resume goes back to the checkpoint before it):

- ``kill``: SIGKILL this worker, as a crash would; its agent sees it die (with ``--max-restarts`` left it
  restarts the node's workers, which resume);
- ``kill-node``: SIGKILL this node's torchrun agent, then this worker: the whole node is lost, as a machine
  that goes down (``worker.sh`` reports the agent's end, the other nodes fail or wait for it to return);
- ``hang``: SIGSTOP this worker, as a rank stuck in a kernel or a deadlock: it never reaches the next
  collective, and only SIGKILL ends it (the others time out after ``dist_timeout_s``);
- ``pause``: wait after the step until SIGTERM or SIGINT comes (a graceful stop, or torchrun restarting the workers
  because a node joined: ``worker.sh --min-nodes``), then go on: a run held at a known step until a node
  has returned. An elastic run that already has all its nodes when it reaches the step (the top of
  ``worker.sh``'s range: the lost node came back sooner) has none to wait for: the pause is spent and the run
  goes on.

Several faults, on different ranks, are separated by commas (``kill-node:rank=2:step=6,pause:rank=0:step=9``).

A fault fires once per run directory: before acting the rank writes ``logs/rank-<R>.fault`` there (what it did,
and its pid, by which a hung rank can be SIGKILLed at once instead of after torchrun's 30 s), and a
restarted or relaunched run of the same run directory passes step ``N`` untouched, so a resume can be
tested with the variable still set. Every armed rank logs a WARNING at the start: a real run never has it.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from distqa.config import ConfigError
from distqa.distributed.elastic import NodeRange

log = logging.getLogger(__name__)

VARIABLE = "INJECT_FAULT"
"""Not DISTQA_*: those are settings, which enter the config (and its hash, which every rank must share)."""
ACTIONS = ("kill", "kill-node", "hang", "pause")
WHAT = {"kill": "be SIGKILLed", "kill-node": "lose its node (its torchrun agent and itself SIGKILLed)",
        "hang": "freeze (SIGSTOP)", "pause": "wait for a signal (a stop, a new rendezvous round)"}
PAUSE_ENDS = {signal.SIGTERM, signal.SIGINT}
"""What ends a pause: torchrun's SIGTERM (a restart for a new round, a stop), or an interrupt."""
FORM = ("ACTION:rank=R:step=N with ACTION kill, kill-node, hang or pause (e.g. kill:rank=1:step=30), several on "
        "different ranks separated by commas")


@dataclass(frozen=True)
class Fault:
    """What to do, on which global rank, after which optimizer step."""

    action: str
    rank: int
    step: int

    @classmethod
    def parse(cls, spec: str) -> Fault:
        """``ACTION:rank=R:step=N`` (the fields after the action in any order); :class:`ConfigError` naming the
        variable and the form otherwise."""
        action, *fields = spec.strip().split(":")
        values = dict(field.partition("=")[::2] for field in fields)
        if action not in ACTIONS or sorted(values) != ["rank", "step"] or len(fields) != 2 \
                or not all(value.isdigit() for value in values.values()) or int(values["step"]) < 1:
            raise ConfigError(f"{VARIABLE}={spec!r} is not a fault: write {FORM}, step 1 or later; "
                              "or unset it for a real run")
        return cls(action, int(values["rank"]), int(values["step"]))

    @classmethod
    def parse_all(cls, spec: str) -> list[Fault]:
        """The comma-separated faults of ``spec``, at most one per rank."""
        faults = [cls.parse(part) for part in spec.split(",")] if spec.strip() else []
        if len({fault.rank for fault in faults}) != len(faults):
            raise ConfigError(f"{VARIABLE}={spec!r} names one rank twice: one fault per rank ({FORM})")
        return faults

    def __str__(self) -> str:
        return f"{self.action} rank {self.rank} after step {self.step}"


class ArmedFault:
    """The fault of this rank's run, if any: :meth:`at` after every optimizer step is all the trainer calls."""

    def __init__(self, fault: Fault | None, rank: int, marker: Path, nodes_missing: bool = True) -> None:
        self.fault, self.rank, self.marker = fault, rank, marker
        self._mine = fault is not None and fault.rank == rank and not marker.exists()
        self.nodes_missing = nodes_missing
        """False in an elastic run at the top of its node range: a pause then has no node to wait for."""

    @classmethod
    def from_environment(cls, rank: int, run_dir: Path, environ: Mapping[str, str] | None = None) -> ArmedFault:
        """The fault ``INJECT_FAULT`` names (none when unset or empty), with a WARNING on every rank when
        set: rank 0 says what the run will suffer, the rank that acts says so, or that it did so already."""
        environ = os.environ if environ is None else environ
        spec = environ.get(VARIABLE, "")
        faults = Fault.parse_all(spec)
        fault = next((f for f in faults if f.rank == rank), faults[0] if faults else None)
        node_range = NodeRange.from_environment(environ)
        full = node_range is not None and node_range.elastic and \
            int(environ.get("WORLD_SIZE", "1") or 1) == node_range.world_sizes[-1]
        armed = cls(fault, rank, run_dir / "logs" / f"rank-{rank}.fault", nodes_missing=not full)
        if fault is None:
            return armed
        if any(f.action == "kill-node" for f in faults) and "TORCHELASTIC_RUN_ID" not in environ:
            raise ConfigError(f"{VARIABLE}={spec!r}: kill-node ends this process's torchrun agent, and this process "
                              "was not started by torchrun (scripts/worker.sh); use kill or hang")
        if len(faults) > 1 and fault.rank != rank:
            if rank == 0:
                log.warning("fault injection armed (%s=%s): %s, once per run directory; unset it for a real run",
                            VARIABLE, spec, "; ".join(f"rank {f.rank} will {WHAT[f.action]} after step {f.step}"
                                                      for f in faults))
            return armed
        if armed._mine:
            log.warning("fault injection armed (%s=%s): this rank (%d) will %s after step %d; unset it for a real "
                        "run", VARIABLE, spec, rank, WHAT[fault.action], fault.step)
        elif fault.rank == rank:
            log.warning("fault injection (%s=%s): done already in this run directory (%s), not again",
                        VARIABLE, spec, armed.marker)
        elif rank == 0:
            log.warning("fault injection armed (%s=%s): rank %d will %s after step %d, once per run directory; "
                        "unset it for a real run", VARIABLE, spec, fault.rank, WHAT[fault.action], fault.step)
        return armed

    def at(self, step: int) -> None:
        """After optimizer step ``step``: the fault acts when it is this rank's and this step (and never did in
        this run directory); otherwise nothing happens."""
        if not self._mine or self.fault is None or step != self.fault.step:
            return
        self._mine = False
        if self.fault.action == "pause" and not self.nodes_missing:
            self.marker.parent.mkdir(parents=True, exist_ok=True)
            self.marker.write_text(f"{self.fault}: not waiting, the run has all its nodes (pid {os.getpid()})\n")
            log.warning("fault injection (%s): %s: the run has all its nodes, none to wait for; going on",
                        VARIABLE, self.fault)
            return
        if self.fault.action == "pause":  # blocked from before the marker, so a stop that comes at once still wakes it
            signal.pthread_sigmask(signal.SIG_BLOCK, PAUSE_ENDS)
        self.marker.parent.mkdir(parents=True, exist_ok=True)
        self.marker.write_text(f"{self.fault} (pid {os.getpid()})\n")  # a hung rank's pid, to SIGKILL it
        log.warning("fault injection (%s): %s now", VARIABLE, self.fault)
        for handler in logging.getLogger().handlers:  # the line must be in the log before the process ends
            handler.flush()
        if self.fault.action == "pause":
            received = signal.sigwait(PAUSE_ENDS)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, PAUSE_ENDS)
            os.kill(os.getpid(), received)  # again, for its handler (distqa.distributed.stop records a stop)
            return
        if self.fault.action == "kill-node":
            os.kill(os.getppid(), signal.SIGKILL)  # torchrun's agent (the worker's parent) first, then the worker
        os.kill(os.getpid(), signal.SIGSTOP if self.fault.action == "hang" else signal.SIGKILL)
