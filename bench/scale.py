"""The control plane's cost as the node count grows: N emulated nodes on this machine, ours beside a bare torchrun.

    .venv/bin/python bench/scale.py --nodes 2,4,8,16,32           # the table of docs/SCALING.md (about 25 min, 2 cores)
    .venv/bin/python bench/scale.py --nodes 8 --procs-per-node 4  # 8 nodes × 4 processes
    .venv/bin/python bench/scale.py --nodes 2,4 --no-loss         # quicker: no node lost
    .venv/bin/python bench/scale.py --many-losses                 # 16 nodes: 4 lost at once, node 0 among them, then
                                                                  # one more while the survivors re-form

Each node is one ``scripts/worker.sh`` (its agent, then its workers) on 127.0.0.1, training the machinery task (the
example's text classifier, torch only, dropout off) with a per-rank batch of 2 and a global batch of 2 × ranks. At each
N, three runs:

- **ours, file checkpoints**: an external rendezvous store (a process of its own, so its traffic can be read from
  ``/proc/<pid>/io``), ``--min-nodes N/2``, 16 steps, a checkpoint at step 10, then N/4 nodes (the highest ranks; 1
  at N < 4) lost at step 12 (``INJECT_FAULT=kill-node``), the survivors' save of step 12, their resume at the smaller
  world size (whose global batch no longer splits evenly: the shares differ by one) and the end at step 16;
- **ours, sharded checkpoints, through the local launcher** (``scripts/run_distributed_locally.sh``): a sharded
  checkpoint at step 10, every rank paused after step 12, then Ctrl-C to the launcher; every node must stop with a
  checkpoint of the step it reached and no process of the run may be left;
- **the bare floor** (``bench/scale_floor.py``): torchrun's own agent, ``init_process_group``, DDP over a model of the
  same shape, the same steps and a ``torch.save`` on rank 0; no distqa.

Every process carries ``bench/scale_probe/sitecustomize.py``, which records its CPU-seconds at each phase, the
collectives and store operations it makes (by whose code) and its peak RSS. On 2 cores a wall time grows with N only
because the CPU is shared, so the figures are CPU-seconds per rank and counts per rank; each is printed beside its
value at N = 2 (the flat targets) or beside the floor (the start-up target). Prints PASS/MISS per target.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from targets import Target

REPO_ROOT = Path(__file__).resolve().parents[1]
PROBE = Path(__file__).resolve().parent / "scale_probe"
TASK = ["--task", "examples.text_classification.task:TextClassification", "--preset", "none",
        "--progress-bar", "false", "--tensorboard", "false", "--warmup-steps", "2", "--classifier-dropout", "0",
        "--per-rank-batch-size", "2", "--log-every", "5", "--dist-timeout-s", "120"]
STEPS, CHECKPOINT_AT, LOSS_AT = 16, 10, 12
RENDEZVOUS = {"RDZV_LAST_CALL_TIMEOUT": "3", "RDZV_JOIN_TIMEOUT": "900"}
"""A short last call: the survivors' round completes 3 s after the last of them joined, not torchrun's 30 s."""
FLAT_BOUND, FLOOR_BOUND = 1.25, 1.5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment(probe_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTQA_", "SCALE_", "INJECT_"))}
    return env | RENDEZVOUS | {
        "PYTHON": sys.executable, "NODE_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
        "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "SCALE_PROBE_DIR": str(probe_dir),
        "PYTHONPATH": os.pathsep.join([str(PROBE), str(REPO_ROOT / "src"), str(REPO_ROOT)])} | extra


@contextlib.contextmanager
def rendezvous_store(port: int) -> Iterator[dict[str, int]]:
    """A TCPStore master of its own (what ``python -m distqa.launch.rendezvous_store`` runs, without distqa), and at
    the end what it read and wrote through the kernel: the store traffic of the whole run."""
    code = (f"import time, torch.distributed as d; s = d.TCPStore('127.0.0.1', {port}, is_master=True, "
            "multi_tenant=True, wait_for_workers=False); print('ready', flush=True); time.sleep(86400)")
    store = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    traffic: dict[str, int] = {}
    try:
        assert store.stdout is not None and store.stdout.readline().strip() == "ready", "the store did not start"
        started = _io(store.pid)  # its own start-up read the interpreter's and torch's files: not store traffic
        yield traffic
        ended = _io(store.pid)
        traffic.update({name: ended[name] - started[name] for name in ended})
    finally:
        store.kill()
        store.wait()


def _io(pid: int) -> dict[str, int]:
    """What a process has read and written through the kernel (sockets included) and in how many calls."""
    with open(f"/proc/{pid}/io") as io:
        fields = dict(line.split(": ") for line in io.read().splitlines())
    return {name: int(fields[name]) for name in ("rchar", "wchar", "syscr", "syscw")}


def wait_all(processes: Sequence[subprocess.Popen[bytes]], timeout_s: float) -> list[int]:
    """Every process's exit status; past ``timeout_s`` (a hang guard) every process group is killed."""
    deadline = time.monotonic() + timeout_s
    codes = []
    for process in processes:
        try:
            codes.append(process.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for other in processes:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(other.pid, signal.SIGKILL)
            raise SystemExit(f"bench/scale.py: a run did not end within {timeout_s:.0f} s (a hang guard); its "
                             "processes were killed; see the logs in its folder (--keep DIR keeps them)") from None
    return codes


def checkpoint_at(checkpoints: Path, step: int, suffix: str) -> Path | None:
    """The checkpoint of ``step`` in a run's checkpoints folder (``step-00000010.pt``), None when there is none."""
    return next((path for path in checkpoints.glob(f"step-*{step}{suffix}")
                 if re.fullmatch(rf"step-0*{step}{re.escape(suffix)}", path.name)), None)


def records(probe_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted(probe_dir.glob("*.json"))]


@dataclass
class Run:
    """One run's processes, as their probes left them, and what the bench saw from outside."""

    name: str
    nodes: int
    procs: int
    folder: Path
    wall_s: float = 0.0
    codes: list[int] = field(default_factory=list)
    store: dict[str, int] = field(default_factory=dict)
    procs_seen: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ranks(self) -> int:
        return self.nodes * self.procs

    def workers(self, world_size: int | None = None) -> list[dict[str, Any]]:
        size = self.ranks if world_size is None else world_size
        return [r for r in self.procs_seen if r["role"] == "worker" and r["world_size"] == size]

    def agents(self) -> list[dict[str, Any]]:
        return [r for r in self.procs_seen if r["role"] == "agent"]


def launch_ours(run: Run, port: int, min_nodes: int, extra: Sequence[str], env_extra: dict[str, str]) -> None:
    """N worker.sh nodes against the external store on ``port``; waits for all of them."""
    probe_dir = run.folder / "probe"
    probe_dir.mkdir(parents=True)
    trainer = [*TASK, "--output-dir", str(run.folder / "results"),
               "--global-batch-size", str(2 * run.ranks), *extra]
    nodes = []
    started = time.time()
    for node in range(run.nodes):
        command = [str(REPO_ROOT / "scripts" / "worker.sh"), "--nnodes", str(run.nodes), "--min-nodes", str(min_nodes),
                   "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port),
                   "--run-id", run.name, "--max-restarts", "3", "--external-store", "--nproc-per-node",
                   str(run.procs), "--", *trainer]
        log = open(run.folder / f"node-{node}.log", "wb")  # noqa: SIM115 (closed with the process: the child has it)
        nodes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                      env=environment(probe_dir, SCALE_NODE=str(node), **env_extra),
                                      start_new_session=True))
    run.codes = wait_all(nodes, 600 + 40 * run.ranks)
    run.wall_s = time.time() - started
    run.procs_seen = records(probe_dir)
    run.procs_seen.append({"role": "launch", "started_wall": started})


def run_file_and_loss(nodes: int, procs: int, folder: Path, lose: bool) -> Run:
    run = Run("file", nodes, procs, folder / f"file-{nodes}x{procs}")
    lost = max(1, nodes // 4) if lose else 0
    min_nodes = max(1, nodes // 2) if lose else nodes
    lost_ranks = range((nodes - lost) * procs, nodes * procs, procs)  # one rank per lost node: kill-node takes it all
    fault = ",".join(f"kill-node:rank={rank}:step={LOSS_AT}" for rank in lost_ranks)
    port = free_port()
    # The last call outlasts the spread of the nodes' starts on this machine (an agent's start is about 1.5 CPU-s,
    # and 2 cores start them): a shorter one completes the first round with the minimum while the others start,
    # and each late node's new round stops every worker still importing torch (docs/SCALING.md, 32 nodes).
    last_call = {"RDZV_LAST_CALL_TIMEOUT": str(max(3, 2 * nodes))}
    with rendezvous_store(port) as traffic:
        launch_ours(run, port, min_nodes, ["--max-steps", str(STEPS), "--checkpoint-every", str(CHECKPOINT_AT),
                                           "--checkpoint-format", "file"],
                    last_call | ({"INJECT_FAULT": fault} if fault else {}))
    run.store = traffic
    ended = [code for node, code in enumerate(run.codes) if node < nodes - lost]
    if any(ended):
        run.notes.append(f"surviving nodes exited {ended}: see {run.folder}/node-*.log")
    return run


def run_sharded_with_ctrl_c(nodes: int, procs: int, folder: Path) -> Run:
    """The local launcher with sharded checkpoints: Ctrl-C once step 10's checkpoint is on disk."""
    run = Run("sharded", nodes, procs, folder / f"sharded-{nodes}x{procs}")
    probe_dir = run.folder / "probe"
    probe_dir.mkdir(parents=True)
    results = run.folder / "results"
    command = [str(REPO_ROOT / "scripts" / "run_distributed_locally.sh"), "--nodes", str(nodes), "--procs-per-node",
               str(procs), "--port", str(free_port()), "--run-id", "sharded", "--", *TASK, "--output-dir", str(results),
               "--global-batch-size", str(2 * run.ranks), "--max-steps", "400", "--checkpoint-every",
               str(CHECKPOINT_AT), "--checkpoint-format", "sharded", "--eval-every", "0",
               "--keep-checkpoints", "1000"]  # step 10's stays on disk for the bench to count its files
    started = time.time()
    log = open(run.folder / "launcher.log", "wb")  # noqa: SIM115
    # Every rank pauses after step 12 until the stop's signal (INJECT_FAULT pause): the Ctrl-C lands on a run that is
    # still going, whatever the machine's load, past the checkpoint of step 10.
    pause = ",".join(f"pause:rank={rank}:step={LOSS_AT}" for rank in range(run.ranks))
    launcher = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                env=environment(probe_dir, INJECT_FAULT=pause), start_new_session=True,
                                preexec_fn=interruptible)
    checkpoints, logs = results / "sharded" / "checkpoints", results / "sharded" / "logs"
    deadline = time.monotonic() + 600 + 40 * run.ranks
    while len(list(logs.glob("rank-*.fault"))) < run.ranks and launcher.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    checkpoint = checkpoint_at(checkpoints, CHECKPOINT_AT, ".dcp")
    run.notes.append(f"listening TCP ports of the run's processes: {len(listening_ports(probe_dir))}")
    launcher.send_signal(signal.SIGINT)  # what Ctrl-C in its terminal sends it (its process group: the nodes too)
    run.codes = wait_all([launcher], 300)
    run.wall_s = time.time() - started
    time.sleep(1)
    left = [r["pid"] for r in records(probe_dir) if Path(f"/proc/{r['pid']}").exists()]
    run.notes.append(f"Ctrl-C: launcher exit {run.codes[0]}, processes left {len(left)}")
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    run.procs_seen = records(probe_dir)
    files = sum(1 for p in checkpoint.rglob("*") if p.is_file()) if checkpoint else 0
    run.notes.append(f"files per sharded checkpoint: {files}")
    output = (run.folder / "launcher.log").read_bytes()
    run.notes.append(f"launcher output: {len(output.splitlines())} lines, {len(output)} bytes")
    return run


def interruptible() -> None:
    """In the launcher's process, before it runs: SIGINT's default action, as a terminal's foreground job has it. A
    bench started in the background of a non-interactive shell ignores SIGINT, its children inherit that, and bash
    cannot trap a signal that was ignored when it started: the launcher would never see the Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def listening_ports(probe_dir: Path) -> set[int]:
    """The TCP ports the run's processes listen on now (their sockets' inodes in /proc/net/tcp)."""
    inodes: set[str] = set()
    for record in records(probe_dir):
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{record['pid']}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            for line in list(lines)[1:]:
                parts = line.split()
                if parts[3] == "0A" and parts[9] in inodes:  # 0A: LISTEN
                    ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


def run_floor(nodes: int, procs: int, folder: Path) -> Run:
    run = Run("floor", nodes, procs, folder / f"floor-{nodes}x{procs}")
    probe_dir = run.folder / "probe"
    probe_dir.mkdir(parents=True)
    port = free_port()
    started = time.time()
    with rendezvous_store(port) as traffic:
        processes = []
        for node in range(nodes):
            command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(procs),
                       "--max-restarts", "0", "--nnodes", str(nodes), "--rdzv-backend", "c10d", "--rdzv-endpoint",
                       f"127.0.0.1:{port}", "--rdzv-id", "floor", "--rdzv-conf", "is_host=0,join_timeout=900",
                       "--local-addr", "127.0.0.1", str(REPO_ROOT / "bench" / "scale_floor.py"), "--steps",
                       str(STEPS), "--checkpoint-at", str(CHECKPOINT_AT), "--output", str(run.folder / "results")]
            log = open(run.folder / f"node-{node}.log", "wb")  # noqa: SIM115
            # The worker store arranged as ours (distqa.launch.node sets it): a store per round, not the agent's.
            env = environment(probe_dir, SCALE_NODE=str(node), TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
            processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                              start_new_session=True))
        run.codes = wait_all(processes, 600 + 40 * run.ranks)
    run.store = traffic
    run.wall_s = time.time() - started
    run.procs_seen = records(probe_dir)
    run.procs_seen.append({"role": "launch", "started_wall": started})
    return run


# --- what the runs' probes say ----------------------------------------------------------------------------------

def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def phases(worker: dict[str, Any]) -> dict[str, float]:
    """CPU-seconds of one worker's phases (a floor's worker has no preflight: 0)."""
    m = worker["marks"]
    if not {"imports", "process_group", "data_and_model", "first_step"} <= m.keys():
        return {}
    preflight_end = m.get("preflight", m["process_group"])
    return {"imports": m["imports"], "process_group": m["process_group"] - m["imports"],
            "preflight": preflight_end - m["process_group"], "data_and_model": m["data_and_model"] - preflight_end,
            "first_step": m["first_step"] - m["data_and_model"], "step": median(worker["steps"]),
            "to_first_step": m["first_step"]}


def ours_calls(record: dict[str, Any], kind: str, region: Sequence[str]) -> tuple[int, int]:
    """Calls and bytes of ``kind`` (collective, store) made by distqa's code in the phases ``region``."""
    calls = bytes_ = 0
    for key, count in record["calls"].items():
        what, _, who, phase = key.split(":")
        if what == kind and who == "distqa" and phase in region:
            calls += count
            bytes_ += record["bytes"][key]
    return calls, bytes_


def store_calls(record: dict[str, Any], who: str) -> int:
    """Store operations made by ``who``'s code in any phase (an agent's watcher thread and its main thread overlap)."""
    return sum(count for key, count in record["calls"].items() if key.startswith("store:") and f":{who}:" in key)


START_UP = ("start", "process_group", "preflight", "data_and_model", "first_step")


def summarise(run: Run) -> dict[str, float]:
    """The per-rank medians of one run."""
    workers = [w for w in run.workers() if phases(w)]
    figures: dict[str, float] = {}
    if not workers:
        run.notes.append("no worker reached its first step")
        return figures
    by_phase = [phases(w) for w in workers]
    for name in by_phase[0]:
        figures[name] = median([p[name] for p in by_phase])
    agents = run.agents()
    started = [a["marks"]["workers_started"] for a in agents if "workers_started" in a["marks"]]
    figures["agent_to_workers"] = median(started)
    figures["agent_cpu"] = median([a["cpu_s"] for a in agents])
    figures["rendezvous_cpu"] = median([a["rendezvous"][0] for a in agents if a["rendezvous"]])
    figures["cpu_to_first_step"] = figures["to_first_step"] + figures["agent_to_workers"] * (1 / run.procs)
    launch = next(r["started_wall"] for r in run.procs_seen if r["role"] == "launch") \
        if any(r["role"] == "launch" for r in run.procs_seen) else min(r["started_wall"] for r in run.procs_seen)
    figures["wall_to_first_step"] = max(w["marks"]["first_step_wall"] for w in workers) - launch
    saves_0 = [s for w in workers if w["rank"] == 0 for s in w["saves"]]
    saves_others = [s for w in workers if w["rank"] != 0 for s in w["saves"]]
    figures["save_rank0"], figures["save_other"] = median(saves_0), median(saves_others)
    for name, region in (("start_up", START_UP), ("steps", ("steps",)), ("save", ("saves",))):
        calls = [ours_calls(w, "collective", region) for w in workers]
        figures[f"{name}_ops"] = median([c for c, _ in calls])
        figures[f"{name}_bytes"] = median([b for _, b in calls])
    steps = median([len(w["steps"]) + 1 for w in workers])
    figures["steps_ops"] /= steps
    figures["steps_bytes"] /= steps
    store_ops = [store_calls(a, "distqa") for a in agents]
    figures["store_ops_ours"] = median(store_ops)
    figures["store_ops_per_watcher_read"] = median([ops / max(1, len(a["watcher_reads"]))
                                                    for ops, a in zip(store_ops, agents, strict=True)])
    figures["store_ops_torch"] = median([store_calls(a, "torch") for a in agents])
    if run.store:
        figures["store_bytes_per_rank"] = (run.store["rchar"] + run.store["wchar"]) / run.ranks
    figures["rss_agent_mb"] = median([a["max_rss_kb"] / 1024 for a in agents])
    figures["rss_worker_mb"] = median([w["max_rss_kb"] / 1024 for w in workers])
    figures["processes_per_node"] = sum(1 for r in run.procs_seen if r["role"] in ("agent", "worker")
                                        and (r.get("world_size") in (None, run.ranks))) / run.nodes
    recovered = [w for w in run.procs_seen if w["role"] == "worker" and w["world_size"]
                 and w["world_size"] < run.ranks and "first_step" in w["marks"]]
    if recovered:
        lost = [w for w in run.workers() if w["step_walls"] and "first_step" in w["marks"]
                and not w["survivor_saves"]]
        fault_wall = max(w["step_walls"][-1] for w in lost) if lost else float("nan")
        survivors = [w for w in run.workers() if w["survivor_saves"]]
        figures["survivor_save_cpu"] = median([s for w in survivors for s in w["survivor_saves"]])
        figures["recovery_cpu"] = median([w["marks"]["first_step"] for w in recovered]) \
            + figures["survivor_save_cpu"]
        figures["recovery_wall"] = min(w["marks"]["first_step_wall"] for w in recovered) - fault_wall
    return figures


def file_checks(run: Run) -> dict[str, float]:
    """What the file run left on disk: files per checkpoint, rank 0's log bytes per step, the survivors' lines."""
    results = run.folder / "results" / run.name
    figures: dict[str, float] = {}
    checkpoints = results / "checkpoints"
    saved = checkpoint_at(checkpoints, CHECKPOINT_AT, ".pt")
    figures["files_per_checkpoint"] = sum(1 for p in checkpoints.glob(f"{saved.name}*") if p.is_file()) if saved else 0
    log = (results / "logs" / "rank-0.log").read_text() if (results / "logs" / "rank-0.log").is_file() else ""
    ends = [m.end() for m in re.finditer(r"step (5|15)/\d+ .*\n(.*step time by rank.*\n)?", log)]
    if len(ends) >= 2:
        figures["log_bytes_per_step"] = (ends[-1] - ends[0]) / 10
    output = "".join(p.read_text(errors="replace") for p in sorted(run.folder.glob("node-*.log")))
    figures["survivor_lines"] = len(re.findall(r"lost a peer during", output))
    figures["saved_by_survivor"] = len(re.findall(rf"saved step {LOSS_AT} for the resume", output))
    figures["ended_at_last_step"] = float(checkpoint_at(checkpoints, STEPS, ".pt") is not None)
    return figures


# --- the report ---------------------------------------------------------------------------------------------------

CPU_COLUMNS = (("imports", "imports"), ("process_group", "pg"), ("preflight", "preflight"),
               ("data_and_model", "data+model"), ("first_step", "1st step"), ("cpu_to_first_step", "to 1st (+agent)"),
               ("wall_to_first_step", "wall to 1st s"), ("step", "step"), ("save_rank0", "save r0"),
               ("save_other", "save r>0"), ("rendezvous_cpu", "rdzv"), ("agent_cpu", "agent all"),
               ("recovery_cpu", "recovery"), ("recovery_wall", "recovery wall s"))
COUNT_COLUMNS = (("start_up_ops", "ops start"), ("start_up_bytes", "B start"), ("steps_ops", "ops/step"),
                 ("steps_bytes", "B/step"), ("save_ops", "ops/save"), ("save_bytes", "B/save"),
                 ("store_ops_ours", "store ops ours/agent"), ("store_ops_per_watcher_read", "per read"),
                 ("store_ops_torch", "store ops torch/agent"),
                 ("store_bytes_per_rank", "store B/rank"), ("files_per_checkpoint", "files/ckpt"),
                 ("log_bytes_per_step", "log B/step"), ("processes_per_node", "procs/node"),
                 ("rss_agent_mb", "RSS agent MB"), ("rss_worker_mb", "RSS worker MB"))
FLAT = ("start_up_bytes", "steps_bytes", "save_bytes", "start_up_ops", "steps_ops", "save_ops",
        "store_ops_per_watcher_read",
        "files_per_checkpoint", "log_bytes_per_step", "preflight", "save_rank0", "save_other")
"""Per-rank figures that must stay within FLAT_BOUND of their value at the smallest N."""


def table(title: str, rows: dict[str, dict[str, float]], columns: Sequence[tuple[str, str]]) -> None:
    print(f"\n{title}")
    shown = [(key, label) for key, label in columns if any(key in row for row in rows.values())]
    print(f"{'run':<16}" + "".join(f"{label:>{max(10, len(label) + 1)}}" for _, label in shown))
    for name, row in rows.items():
        cells = []
        for key, label in shown:
            value = row.get(key)
            width = max(10, len(label) + 1)
            cells.append(f"{'-':>{width}}" if value is None or value != value else
                         f"{value:>{width}.3g}" if abs(value) < 1000 else f"{value:>{width}.0f}")
        print(f"{name:<16}" + "".join(cells))


def targets(ours: dict[str, dict[str, float]], floor: dict[str, dict[str, float]]) -> list[Target]:
    """The flat targets (largest N against the smallest) and the start-up target (ours against the floor)."""
    names = list(ours)
    first, last = names[0], names[-1]
    found = []
    for key in FLAT:
        low, high = ours[first].get(key), ours[last].get(key)
        if low is None or high is None or low != low or high != high:
            continue
        ratio = high / low if low else (1.0 if not high else float("inf"))
        found.append(Target(f"{key}: {last} / {first}", ratio, FLAT_BOUND, at_most=True))
    for name in names:
        if name in floor and "cpu_to_first_step" in floor[name]:
            found.append(Target(f"CPU to the first step, ours / floor at {name}",
                                ours[name]["cpu_to_first_step"] / floor[name]["cpu_to_first_step"], FLOOR_BOUND, True))
    if last in floor and "wall_to_first_step" in floor[last]:
        found.append(Target(f"wall to the first step, ours / floor at {last}",
                            ours[last]["wall_to_first_step"] / floor[last]["wall_to_first_step"], FLOOR_BOUND, True))
    return found


def memory_line(rows: dict[str, dict[str, float]]) -> str:
    """Where N stops on this machine's memory: the nodes whose agent and workers fit in MemTotal."""
    with open("/proc/meminfo") as meminfo:
        total_mb = int(next(line.split()[1] for line in meminfo if line.startswith("MemTotal"))) / 1024
    measured = [row for row in rows.values() if row.get("rss_worker_mb")]
    if not measured:
        return "memory: no run reached its first step"
    per_node = measured[-1].get("rss_agent_mb", 0) + measured[-1]["rss_worker_mb"]
    return (f"memory: {per_node:.0f} MB of peak RSS per node (agent + worker; shared pages counted in each), "
            f"{total_mb / 1024:.0f} GiB here: at most about {total_mb / per_node:.0f} emulated nodes of one process")


def parse_nodes(text: str) -> list[int]:
    try:
        nodes = [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        raise SystemExit(f"--nodes takes node counts separated by commas (2,4,8), got {text!r}") from None
    if not nodes or min(nodes) < 2:
        raise SystemExit(f"--nodes: every count must be >= 2, got {text!r}")
    return nodes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="2,4,8,16,32", help="node counts, comma-separated (default 2,4,8,16,32)")
    parser.add_argument("--procs-per-node", type=int, default=1, help="processes per node (default 1)")
    parser.add_argument("--no-loss", action="store_true", help="lose no node in the file run")
    parser.add_argument("--no-sharded", action="store_true", help="skip the sharded run through the local launcher")
    parser.add_argument("--sharded-only", action="store_true",
                        help="only the sharded run through the local launcher, and its Ctrl-C (no table)")
    parser.add_argument("--many-losses", action="store_true", help="only the 16-node scenario of many losses")
    parser.add_argument("--keep", type=Path, help="keep every run's folder under this one")
    args = parser.parse_args(argv)
    folder = args.keep or Path(tempfile.mkdtemp(prefix="distqa-scale-"))
    folder.mkdir(parents=True, exist_ok=True)
    if args.many_losses:
        from scale_losses import many_losses  # only this scenario needs it
        return many_losses(folder)
    ours: dict[str, dict[str, float]] = {}
    floor: dict[str, dict[str, float]] = {}
    if args.sharded_only:
        for nodes in parse_nodes(args.nodes):
            for note in run_sharded_with_ctrl_c(nodes, args.procs_per_node, folder).notes:
                print(f"{nodes}x{args.procs_per_node}: {note}")
        return 0
    for nodes in parse_nodes(args.nodes):
        name = f"{nodes}x{args.procs_per_node}"
        print(f"[scale] {name}: floor, ours (file{'' if args.no_loss else ' + loss'}), ours (sharded + Ctrl-C)",
              file=sys.stderr, flush=True)
        floor_run = run_floor(nodes, args.procs_per_node, folder)
        floor[name] = summarise(floor_run)
        file_run = run_file_and_loss(nodes, args.procs_per_node, folder, lose=not args.no_loss)
        ours[name] = summarise(file_run) | file_checks(file_run)
        notes = file_run.notes
        if not args.no_sharded:
            sharded = run_sharded_with_ctrl_c(nodes, args.procs_per_node, folder)
            ours[name]["files_per_sharded_checkpoint_per_rank"] = float(
                re.search(r"files per sharded checkpoint: (\d+)", " ".join(sharded.notes))[1]) / sharded.ranks
            notes += sharded.notes
        for note in notes:
            print(f"[scale] {name}: {note}", file=sys.stderr, flush=True)
    print(f"bench/scale.py: {len(ours)} node counts × {args.procs_per_node} process(es); CPU-seconds per rank "
          "(median over ranks); counts per rank; ours = distqa's worker.sh, floor = bare torchrun")
    table("CPU-seconds per rank by phase, ours", ours, CPU_COLUMNS)
    table("CPU-seconds per rank by phase, the bare floor", floor, CPU_COLUMNS)
    table("The control plane per rank: distqa's collectives (ops, bytes sent + received), store, files, log, memory",
          ours, (*COUNT_COLUMNS, ("files_per_sharded_checkpoint_per_rank", "shard files/rank"),
                 ("survivor_lines", "survivor lines"), ("saved_by_survivor", "saves won"),
                 ("ended_at_last_step", "ended")))
    table("The bare floor's store and memory", floor, (("store_bytes_per_rank", "store B/rank"),
                                                        ("rss_agent_mb", "RSS agent MB"),
                                                        ("rss_worker_mb", "RSS worker MB")))
    print("\n" + memory_line(ours))
    found = targets(ours, floor)
    print()
    for target in found:
        print(target.line())
    print(f"(runs kept in {folder})" if args.keep else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
