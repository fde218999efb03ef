"""What the platform launcher's watch costs the user's machine per poll, as the node count grows: CLI processes and
their CPU time, the launcher's own loop (one `<flow> ps` a poll) beside the per-node look it replaced (one `<flow>
status` per job a poll), both against the stand-in platform (tests/standin/platform_cli.py) in the same run.

    .venv/bin/python bench/platform_polls.py --nodes 2,4,8,16,32 [--polls 4] [--real-cli-starts 3]

Each node count gets a stand-in platform of its own with that many light jobs (a `sleep`, no trainer: the
stand-in's ``command/`` file), then :func:`measure` runs :meth:`Launch.watch` in this process for ``--polls`` polls
and, before each of its polls, the old look (every node's `status`, and nothing else), so both are measured on the
same jobs at the same moments. CPU per poll is the CPU time of the CLI processes it started (this process's
children's rusage), the median over the polls. The stand-in's `status` reads one record and never imports the
platform SDK, while its `ps` runs neuro-flow's own ``LiveRunner.ps`` (the SDK imported, live.yml loaded) as the real
CLI does; a real `neuro-flow status` also loads the SDK and the flow (then starts `apolo status`): the line "real CLI
start-up" measures that floor, to read the old figures against. Ratios measured side by side are what count; the
machine is shared. The target: the new CPU per poll independent of the node count (largest / smallest <= 1.25).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from targets import Target

from distqa.launch.platform import run as platform_run
from distqa.launch.platform.jobs import JOB, Flow
from distqa.launch.platform.options import parse_options

REPO_ROOT = Path(__file__).resolve().parents[1]
STANDIN = REPO_ROOT / "tests" / "standin" / "platform_cli.py"
RUN_ID = f"polls{os.getpid() % 10000}"
"""The run's id: this process's own, so that two measurements at once (a test beside the bench) name no job alike."""
TARGET_RATIO = 1.25


class _PollsDoneError(Exception):
    """Raised from the watch's sleep once the polls asked for are done."""


def children_cpu_s() -> float:
    """User + system CPU seconds of every child process this process has waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cli_calls(state: Path) -> list[str]:
    """Every CLI process the stand-in has answered, as "SUBCOMMAND ARGS..." (its calls.jsonl)."""
    path = state / "calls.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [" ".join([call["command"], *call["args"]]) for call in map(json.loads, lines)]


@contextmanager
def standin_platform(work: Path, nodes: int) -> Iterator[Flow]:
    """A stand-in platform under ``work`` running ``nodes`` light jobs of run RUN_ID; the launcher's Flow for it.
    Every job is killed at the end."""
    state = work / "platform"
    (state / "command").mkdir(parents=True)
    (state / "command" / JOB).write_text("exec sleep 3600\n")  # a node that runs and never ends by itself
    wrapper = work / "neuro-flow"
    wrapper.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(STANDIN))} \"$@\"\n")
    wrapper.chmod(0o755)
    saved = {name: os.environ.get(name) for name in ("STANDIN_PLATFORM_DIR", "STANDIN_PENDING_S")}
    os.environ.update(STANDIN_PLATFORM_DIR=str(state), STANDIN_PENDING_S="0")
    options = parse_options(["--nodes", str(nodes), "--run-id", RUN_ID, "--poll", "0"], {"ENV_FILE": ""})
    assert options is not None
    flow = Flow(str(wrapper), options, REPO_ROOT)
    try:
        submitted = [subprocess.Popen(flow.node_command(rank, ""), cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for rank in range(nodes)]
        said = [process.communicate(timeout=600)[1].decode(errors="replace").strip() for process in submitted]
        failed = [words for words, process in zip(said, submitted, strict=True) if process.returncode]
        if failed:
            raise SystemExit(f"the stand-in could not start {len(failed)} of the {nodes} light jobs: {failed[0]}")
        yield flow
    finally:
        subprocess.run([str(wrapper), "kill", "ALL"], cwd=REPO_ROOT, capture_output=True, timeout=600, check=False)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def old_look(flow: Flow) -> None:
    """The look the launcher took before it listed its jobs: `<flow> status` of every node's job."""
    for rank in range(flow.options.nodes):
        flow.status(JOB, flow.suffix(rank))


def measure(nodes: int, polls: int) -> dict[str, object]:
    """Run the launcher's watch for ``polls`` polls over ``nodes`` light jobs on a fresh stand-in platform, with the
    old per-node look before each poll. Returns, for each: CLI processes per poll, CPU seconds per poll (median),
    and the calls of every poll."""
    if nodes < 1 or polls < 1:
        raise ValueError(f"nodes and polls must be >= 1, got {nodes} and {polls}")
    with tempfile.TemporaryDirectory(prefix="platform-polls-") as work, standin_platform(Path(work), nodes) as flow:
        state = Path(os.environ["STANDIN_PLATFORM_DIR"])
        costs: dict[str, list[float]] = {"new": [], "old": []}
        calls: dict[str, list[list[str]]] = {"new": [], "old": []}
        mark = {"cpu": 0.0, "calls": 0}

        def took(contender: str) -> None:
            now, seen = children_cpu_s(), cli_calls(state)
            costs[contender].append(now - mark["cpu"])
            calls[contender].append(seen[mark["calls"]:])
            mark.update(cpu=now, calls=len(seen))

        def between_polls(_seconds: float) -> None:
            if costs["old"]:  # the watch's poll since the last old look
                took("new")
            if len(costs["new"]) == polls:
                raise _PollsDoneError
            mark.update(cpu=children_cpu_s(), calls=len(cli_calls(state)))
            old_look(flow)
            took("old")

        launch = platform_run.Launch(flow)
        clock = types.SimpleNamespace(sleep=between_polls, monotonic=time.monotonic)
        real_time, platform_run.time = platform_run.time, clock  # type: ignore[assignment]
        try:
            launch.watch("")
        except _PollsDoneError:
            pass
        finally:
            platform_run.time = real_time
    return {"nodes": nodes, "polls": polls,
            **{f"{name}_processes_per_poll": statistics.mean(map(len, calls[name])) for name in calls},
            **{f"{name}_cpu_s_per_poll": statistics.median(costs[name]) for name in costs},
            **{f"{name}_calls": calls[name] for name in calls}}


def real_cli_start_s(starts: int) -> float | None:
    """Median CPU seconds of the installed real `neuro-flow status` up to its login check (a scratch HOME: no
    network is reached), the floor of what each old per-node call cost; None when it is not installed."""
    cli = Path(sys.executable).parent / "neuro-flow"
    if starts < 1 or not cli.exists():
        return None
    figures = []
    with tempfile.TemporaryDirectory(prefix="platform-polls-home-") as home:
        for _ in range(starts):
            before = children_cpu_s()
            subprocess.run([str(cli), "status", JOB, f"{RUN_ID}-0"], cwd=REPO_ROOT, capture_output=True, timeout=300,
                           env={**os.environ, "HOME": home}, check=False)
            figures.append(children_cpu_s() - before)
    return statistics.median(figures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="2,4,8,16,32", help="node counts, comma-separated (default 2,4,8,16,32)")
    parser.add_argument("--polls", type=int, default=4, help="polls measured per node count (default 4)")
    parser.add_argument("--real-cli-starts", type=int, default=3,
                        help="real `neuro-flow status` start-ups to time (default 3; 0 skips)")
    args = parser.parse_args()
    try:
        counts = sorted({int(word) for word in args.nodes.split(",")})
    except ValueError:
        raise SystemExit(f"--nodes must be whole numbers separated by commas, got '{args.nodes}'") from None
    if counts[0] < 1 or args.polls < 1:
        raise SystemExit("--nodes and --polls must be >= 1")
    print(f"machine: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f} (shared: absolute figures shift, "
          "the ratios much less)")
    rows = [measure(nodes, args.polls) for nodes in counts]
    print(f"\nper poll, median of {args.polls} polls; old = one `status` per node (before), new = one `ps` (now)")
    print(f"  {'nodes':>5}  {'old CLI':>7}  {'new CLI':>7}  {'old CPU s':>9}  {'new CPU s':>9}  {'old/new CPU':>11}")
    for row in rows:
        old_cpu, new_cpu = float(row["old_cpu_s_per_poll"]), float(row["new_cpu_s_per_poll"])  # type: ignore[arg-type]
        print(f"  {row['nodes']:>5}  {row['old_processes_per_poll']:>7g}  {row['new_processes_per_poll']:>7g}  "
              f"{old_cpu:>9.3f}  {new_cpu:>9.3f}  {old_cpu / new_cpu:>11.2f}")
    real = real_cli_start_s(args.real_cli_starts)
    if real is not None:
        new_small = float(rows[0]["new_cpu_s_per_poll"])  # type: ignore[arg-type]
        print(f"\nreal CLI start-up (`neuro-flow status` to its login check, median of {args.real_cli_starts}): "
              f"{real:.3f} CPU s = {real / new_small:.2f} x the stand-in's `ps` poll; the old look at N nodes "
              f"cost at least N x that on a real platform ({counts[-1]} nodes: >= {counts[-1] * real:.1f} s a poll)")
    ratio = float(rows[-1]["new_cpu_s_per_poll"]) / float(rows[0]["new_cpu_s_per_poll"])  # type: ignore[arg-type]
    print()
    print(Target(f"new CPU per poll, {counts[-1]} nodes / {counts[0]} nodes", ratio, TARGET_RATIO, True).line())
    processes = max(float(row["new_processes_per_poll"]) for row in rows)  # type: ignore[arg-type]
    print(Target("new CLI processes per poll, most at any node count", processes, 1, True).line())


if __name__ == "__main__":
    main()
