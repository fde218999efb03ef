"""Gradient compression over a slow link: ``--ddp-comm-hook bf16`` against ``none``, 2 gloo ranks, 2 network namespaces.

    .venv/bin/python bench/comm_hook.py           # about 80 s on 2 cores; needs root, ip and tc
    .venv/bin/python bench/comm_hook.py --quick   # smoke test, about 20 s
    .venv/bin/python bench/comm_hook.py --rates 1000 100 --delay-ms 1   # the links are settings

Where network namespaces cannot be made (not root, no ``ip`` or ``tc``, a container without
CAP_NET_ADMIN, no veth or tbf in the kernel; for ``--delay-ms``, no netem, which this CI machine's kernel
lacks), it prints one ``SKIP`` line saying why and exits 0.

The script makes two network namespaces joined by a veth pair of its own (10.213.0.1 and 10.213.0.2, no
route anywhere else, so no traffic leaves them), and starts one torchrun agent in each, exactly as two
machines would (``--nnodes 2``, c10d rendezvous at 10.213.0.1, ``GLOO_SOCKET_IFNAME`` the veth): one gloo
rank per "node", one torch thread each. Each rank builds two of our trainers
(``harness.build_our_trainer``: the real model, DDP wrap, AdamW, schedule, fp32) from the same seed, one
with ``--ddp-comm-hook none`` and one with ``bf16``, on a BERT of 3.6 M parameters (4 layers of width 256,
the tiny-bert tokenizer's vocabulary; a config written locally, random weights), per-rank batch 2 of
64-token windows, one micro-batch per optimizer step (one all-reduce per step: the worst case, which
gradient accumulation divides). ``--quick`` trains data/tiny-bert (0.6 M parameters) at 100 Mbit/s only.
Then:

  1. loss check, on the unthrottled link: each trainer trains ``--loss-steps`` steps from the same
     weights and the same RNG state on the same batches; the mean loss over both ranks after them must
     agree to 1 % (bf16 rounds each gradient to 8 significant bits; the loss still falls the same way)
  2. for each link, each rank shapes the egress of its own end of the veth with ``tc`` (tbf at the
     rate, after a netem delay if ``--delay-ms``; unthrottled: no qdisc at all), then times
     ``Trainer.train_step`` for ``none`` and ``bf16``, interleaved; a figure is the slower rank's mean
     over ``--steps`` steps, the table shows medians over ``--repeats``

Why these rates. Whether the hook pays depends on one ratio: the all-reduce's wire time W (the gradient
bytes over the link rate; with 2 ranks each node sends its whole gradient once) against the step's
compute C. With little overlap, a step takes about C + W without the hook and C + W/2 with it, so the
speed-up (C + W) / (C + W/2) tends to 2 as W/C grows. Our 14.5 MB of fp32 gradients against a step of
about 0.12 s on one core give W/C = 10 at 100 Mbit/s (network-bound: expect about 1.8×) and W/C = 1 at
1 Gbit/s (the all-reduce as long as the compute: about 1.3×); the bare veth (about 10 Gbit/s, W of a few
ms) is a fast fabric, where compressing only costs its casts. The same ratios hold for BERT-base on H100s
(436 MB of gradients against a 36 ms micro-step, docs/PERFORMANCE.md "Scaling model for many nodes")
on 10 Gbit/s Ethernet (W/C = 9.7) and on 100 Gbit/s (W/C = 1.0). The report prints W/C and (C + W) / (C + W/2)
next to each measured ratio.

Targets: none / bf16 >= 1.6 on the slowest link (time per step); none / bf16 >= 0.9 unthrottled (the hook
costs at most 10 % where the network is fast); the loss check to 1 %. Namespaces and veths are removed
in ``finally`` (Ctrl-C and SIGTERM too); every wait is bounded (``--timeout-s``).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import torch
from harness import (
    BENCH_SEED,
    Target,
    add_common_arguments,
    bench_config,
    build_our_trainer,
    dummy_dataset,
    interleaved,
    machine_line,
    median,
    pin_threads,
    print_table,
    print_targets,
    seconds_per_step,
    spread,
)

from distqa.distributed.rng import seed_everything
from distqa.distributed.runtime import all_reduce_max, all_reduce_mean, barrier, distributed_runtime
from distqa.encoders.config import TINY_MODEL_DIR
from distqa.training.trainer import Trainer

WORLD_SIZE, PER_RANK_BATCH, MAX_SEQ_LEN = 2, 2, 64  # little compute per step: the gradients' bytes dominate
ADDRESSES = ("10.213.0.1", "10.213.0.2")  # one per namespace, a /24 of their own
RDZV_PORT = 29513
HOOKS = ("none", "bf16")
MODEL_SIZES = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024,
               "max_position_embeddings": 512}
"""A BERT of 3.6 M parameters: big enough that its 14.5 MB of fp32 gradients dominate a step on a slow link."""
SLOW_TARGET, FAST_TARGET, LOSS_TARGET = 1.6, 0.9, 0.01
NAME_PREFIX = "distqa-commhook-"  # namespaces: <prefix><pid>-<0|1>; veths: dqch<0|1>-<pid>


class LinkUnavailableError(Exception):
    """The namespaces, the veth pair or the qdisc could not be made here: the benchmark is skipped."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, default_repeats=5)
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per contender and repeat")
    parser.add_argument("--loss-steps", type=int, default=20, help="steps of the loss check, per contender")
    parser.add_argument("--rates", type=float, nargs="+", default=[1000.0, 100.0],
                        help="link rates to measure, Mbit/s each way (tbf), besides the unthrottled veth")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay added to every link (netem)")
    parser.add_argument("--timeout-s", type=int, default=900, help="the whole measurement ends by then, or fails")
    # Set when torchrun starts us inside a namespace: this end's veth, the model to build.
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--veth", help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=("bench", "tiny"), default="bench", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.steps, args.loss_steps, args.rates, args.model = 3, 1, 3, [100.0], "tiny"
        args.timeout_s = min(args.timeout_s, 150)
    if any(rate <= 0 for rate in args.rates) or args.delay_ms < 0:
        raise SystemExit("--rates must be > 0 Mbit/s and --delay-ms >= 0")
    args.rates = sorted(args.rates, reverse=True)  # fastest first; the last is the slowest link
    if args.worker:
        worker(args)
        return
    sys.exit(launch(args, sys.argv[1:]))


# --- the two "nodes": namespaces, veth pair, link shaping ----------------------------------------
@dataclass(frozen=True)
class Pair:
    """Two network namespaces and the veth pair between them; index i is node i's end."""

    namespaces: tuple[str, str]
    veths: tuple[str, str]


def launch(args: argparse.Namespace, argv: list[str]) -> int:
    """Make the namespaces, run one torchrun agent in each, remove everything again; SKIP where impossible."""
    reason = missing_prerequisite()
    if reason:
        print(f"SKIP  bench/comm_hook.py: {reason}")
        return 0
    signal.signal(signal.SIGTERM, _interrupt)  # a terminated benchmark still cleans up in `finally`
    remove_stale_pairs()
    try:
        with veth_pair(os.getpid()) as pair:
            shape(pair.veths[0], None, args.delay_ms, namespace=pair.namespaces[0], probe=args.rates[-1])
            return run_nodes(pair, argv, args)
    except LinkUnavailableError as err:
        print(f"SKIP  bench/comm_hook.py: {err}")
        return 0
    except KeyboardInterrupt:
        print("bench/comm_hook.py: interrupted; its processes, namespaces and veths are gone", file=sys.stderr)
        return 130


def missing_prerequisite() -> str | None:
    if os.geteuid() != 0:
        return f"network namespaces need root (running as uid {os.geteuid()})"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found (Debian: apt-get install iproute2)"
    return None


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def ip(*arguments: str, namespace: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``ip`` (``ip -n namespace`` inside one); a failure raises :class:`LinkUnavailableError` with its message."""
    command = ["ip", *(("-n", namespace) if namespace else ()), *arguments]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    if check and result.returncode != 0:
        raise LinkUnavailableError(f"`{' '.join(command)}` failed: {result.stderr.strip() or result.returncode}")
    return result


@contextlib.contextmanager
def veth_pair(tag: int) -> Iterator[Pair]:
    """Namespaces ``<prefix><tag>-0/1`` joined by veths ``dqch0/1-<tag>`` at :data:`ADDRESSES`, removed on exit
    (deleting a namespace deletes its end of the pair, and with it the other end)."""
    pair = Pair((f"{NAME_PREFIX}{tag}-0", f"{NAME_PREFIX}{tag}-1"), (f"dqch0-{tag}", f"dqch1-{tag}"))
    created: list[str] = []
    try:
        for namespace in pair.namespaces:
            ip("netns", "add", namespace)
            created.append(namespace)
        ip("link", "add", pair.veths[0], "netns", pair.namespaces[0], "type", "veth",
           "peer", "name", pair.veths[1], "netns", pair.namespaces[1])
        for namespace, veth, address in zip(pair.namespaces, pair.veths, ADDRESSES, strict=True):
            ip("addr", "add", f"{address}/24", "dev", veth, namespace=namespace)
            ip("link", "set", veth, "up", namespace=namespace)
            ip("link", "set", "lo", "up", namespace=namespace)
        yield pair
    finally:
        # A second Ctrl-C must not cut the clean-up short: hold SIGINT and SIGTERM until it is done.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        for namespace in reversed(created):
            end_processes_in(namespace)
            ip("netns", "delete", namespace, check=False)
        for veth in pair.veths:  # only if creation stopped half-way in this namespace; normally gone
            if ip("link", "show", veth, check=False).returncode == 0:
                ip("link", "delete", veth, check=False)
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def end_processes_in(namespace: str) -> None:
    """SIGKILL to every process still inside ``namespace``: only this script's torchrun agents and their
    workers live there (torchrun starts each worker in a session of its own, out of reach of the agent's)."""
    for pid in ip("netns", "pids", namespace, check=False).stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def remove_stale_pairs() -> None:
    """Namespaces this script left behind when it was SIGKILLed (their pid is gone)."""
    listing = ip("netns", "list", check=False).stdout
    for name in re.findall(rf"^({re.escape(NAME_PREFIX)}(\d+)-[01])\b", listing, re.MULTILINE):
        if not Path(f"/proc/{name[1]}").exists():
            end_processes_in(name[0])
            ip("netns", "delete", name[0], check=False)


def shape(veth: str, rate_mbit: float | None, delay_ms: float, namespace: str | None = None,
          probe: float | None = None) -> None:
    """The egress of ``veth`` (this end of the link): tbf at ``rate_mbit``, behind a netem delay if any, or no
    qdisc at all (rate None, no delay). With ``probe``, apply that rate once and remove it: a check that
    tbf (and netem) exist here, made before any process starts."""
    def tc(*arguments: str, check: bool = True) -> None:
        command = ["tc", *arguments] if namespace is None else ["ip", "netns", "exec", namespace, "tc", *arguments]
        result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
        if check and result.returncode != 0:
            raise LinkUnavailableError(f"`{' '.join(command)}` failed: {result.stderr.strip() or result.returncode}")

    if probe is not None:
        shape(veth, probe, delay_ms, namespace)
        rate_mbit, delay_ms = None, 0.0
    tc("qdisc", "del", "dev", veth, "root", check=False)  # none there yet: fails, fine
    tbf_parent = ["root"]
    if delay_ms > 0:
        tc("qdisc", "add", "dev", veth, "root", "handle", "1:", "netem", "delay", f"{delay_ms}ms", "limit", "100000")
        tbf_parent = ["parent", "1:"]
    if rate_mbit is not None:
        # A bucket of 10 ms of traffic: the rate holds to within a few % (TCP over tbf measured 96 % of it).
        burst = max(32 * 1024, int(rate_mbit * 1e6 / 8 / 100))
        tc("qdisc", "add", "dev", veth, *tbf_parent, "handle", "2:", "tbf", "rate", f"{rate_mbit:g}mbit",
           "burst", str(burst), "latency", "100ms")


def run_nodes(pair: Pair, argv: list[str], args: argparse.Namespace) -> int:
    """One torchrun agent per namespace; both stopped when one fails or time runs out."""
    deadline = time.monotonic() + args.timeout_s
    bench_dir = str(Path(__file__).resolve().parent)
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith(("DISTQA_", "MASTER_", "TORCHELASTIC_")) and k not in
                   {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"}}
    environment.update(OMP_NUM_THREADS=str(args.threads), HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1",
                       PYTHONPATH=os.pathsep.join(filter(None, [bench_dir, os.environ.get("PYTHONPATH")])))
    nodes: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="bench-commhook-") as logs:
        try:
            for node, (namespace, veth, address) in enumerate(zip(pair.namespaces, pair.veths, ADDRESSES,
                                                                   strict=True)):
                command = ["ip", "netns", "exec", namespace, sys.executable, "-m", "torch.distributed.run",
                           "--nnodes", str(WORLD_SIZE), "--node-rank", str(node), "--nproc-per-node", "1",
                           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{ADDRESSES[0]}:{RDZV_PORT}",
                           "--rdzv-id", f"commhook-{os.getpid()}",
                           # The hostname resolves outside the namespaces: say which node hosts the
                           # rendezvous store, and name each node by its veth address.
                           "--rdzv-conf", f"join_timeout=60,read_timeout=60,is_host={str(node == 0).lower()}",
                           "--local-addr", address, "--max-restarts", "0",
                           __file__, "--worker", "--veth", veth, "--model", args.model, *argv]
                with open(Path(logs) / f"node-{node}.err", "wb") as stderr:
                    nodes.append(subprocess.Popen(command, env={**environment, "GLOO_SOCKET_IFNAME": veth},
                                                  stderr=stderr, start_new_session=True))
            codes = wait_all(nodes, deadline)
        finally:
            stop(nodes)
        if any(codes):
            for node in range(len(nodes)):
                tail = (Path(logs) / f"node-{node}.err").read_text(errors="replace").splitlines()[-30:]
                print(f"--- node {node} (exit {codes[node]}), last lines of stderr:", *tail, sep="\n", file=sys.stderr)
            return 1
    return 0


def wait_all(nodes: list[subprocess.Popen[bytes]], deadline: float) -> list[int]:
    """Exit codes of every node. Once one has failed the others get 20 s to notice, then are killed, as all are
    at ``deadline``."""
    failed_at: float | None = None
    while any(process.poll() is None for process in nodes):
        now = time.monotonic()
        if failed_at is None and any(process.returncode not in (None, 0) for process in nodes):
            failed_at = now
        if now > deadline:
            print("bench/comm_hook.py: the nodes did not finish within --timeout-s; killed", file=sys.stderr)
            break
        if failed_at is not None and now > failed_at + 20:
            break
        time.sleep(0.2)
    stop(nodes)
    return [process.returncode for process in nodes]


def stop(nodes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to every node still running (torchrun passes it on to its worker), SIGKILL to its session 10 s
    later; what may still live in the namespaces is killed when they are removed (:func:`end_processes_in`)."""
    running = [process for process in nodes if process.poll() is None]
    for process in running:
        os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for process in running:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


# --- one rank, inside its namespace ----------------------------------------------------------------
def worker(args: argparse.Namespace) -> None:
    pin_threads(args.threads)
    with distributed_runtime("cpu", timeout_s=args.timeout_s) as runtime, \
            tempfile.TemporaryDirectory(prefix=f"bench-commhook-rank{runtime.rank}-") as run_dir, \
            model_directory(args.model) as model_dir:
        flags = ["--model-name-or-path", str(model_dir), "--tokenizer-name-or-path", str(TINY_MODEL_DIR),
                 "--from-scratch", "true", "--precision", "fp32", "--dummy-size", "64",
                 "--max-seq-len", str(MAX_SEQ_LEN), "--max-question-len", "16", "--per-rank-batch-size",
                 str(PER_RANK_BATCH), "--global-batch-size", str(PER_RANK_BATCH * WORLD_SIZE)]
        configs = {hook: bench_config(*flags, "--ddp-comm-hook", hook) for hook in HOOKS}
        dataset = dummy_dataset(configs["none"])
        trainers = {hook: build_our_trainer(configs[hook], runtime, dataset, Path(run_dir)) for hook in HOOKS}
        assert trainers["none"].plan.accumulation == 1
        batches = list(itertools.islice(iter(trainers["none"].loader), 4))

        losses = {hook: train_losses(trainer, batches, args.loss_steps) for hook, trainer in trainers.items()}
        figures: dict[float | None, dict[str, list[float]]] = {}  # by link rate (None: unthrottled)
        for rate in [None, *args.rates]:
            shape(args.veth, rate, args.delay_ms)
            barrier()  # both ends shaped before either times
            figures[rate] = interleaved(
                {hook: lambda trainer=trainer: collective_time(trainer, batches, args.steps)
                 for hook, trainer in trainers.items()}, args.repeats)
        shape(args.veth, None, 0.0)
        if runtime.rank == 0:
            report(args, trainers["none"], figures, losses)


@contextlib.contextmanager
def model_directory(model: str) -> Iterator[Path]:
    """The model to train: data/tiny-bert (--quick) or the :data:`MODEL_SIZES` BERT, whose config.json is
    written here (random weights, the tiny-bert tokenizer's vocabulary: no hub, no download)."""
    if model == "tiny":
        yield TINY_MODEL_DIR
        return
    from transformers import BertConfig  # only the worker needs it (the launcher may SKIP before)

    tiny = BertConfig.from_pretrained(TINY_MODEL_DIR)
    with tempfile.TemporaryDirectory(prefix="bench-commhook-model-") as directory:
        BertConfig(vocab_size=tiny.vocab_size, pad_token_id=tiny.pad_token_id, **MODEL_SIZES).save_pretrained(directory)
        yield Path(directory)


def train_losses(trainer: Trainer, batches: list[dict[str, torch.Tensor]], steps: int) -> list[float]:
    """The mean loss over both ranks of each of ``steps`` steps, from the seed every contender starts from."""
    seed_everything(BENCH_SEED)  # the same dropout masks for every contender
    micro_batches = itertools.cycle(batches)
    return [all_reduce_mean(trainer.train_step(micro_batches)[0]).item() for _ in range(steps)]


def collective_time(trainer: Trainer, batches: list[dict[str, torch.Tensor]], steps: int) -> float:
    """Seconds per step of ``trainer``, both ranks together; the slower rank's figure (what the job runs at)."""
    barrier()
    elapsed = seconds_per_step(trainer.train_step, batches, steps)
    barrier()
    return all_reduce_max(round(elapsed * 1e6), torch.device("cpu")) / 1e6


def link_name(rate_mbit: float | None, delay_ms: float) -> str:
    name = "unthrottled veth" if rate_mbit is None else (
        f"{rate_mbit / 1000:g} Gbit/s" if rate_mbit >= 1000 else f"{rate_mbit:g} Mbit/s")
    return f"{name} + {delay_ms:g} ms" if delay_ms else name


def report(args: argparse.Namespace, trainer: Trainer, figures: dict[float | None, dict[str, list[float]]],
           losses: dict[str, list[float]]) -> None:
    parameters = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    megabytes = parameters * 4 / 1e6
    config = trainer.config
    print(machine_line(args.threads, processes=WORLD_SIZE))
    print(f"model: {'tiny BERT (data/tiny-bert)' if args.model == 'tiny' else 'BERT 4 × 256 (local config)'}, "
          f"{parameters / 1e6:.2f} M parameters: {megabytes:.1f} MB of fp32 gradients per all-reduce "
          f"({megabytes / 2:.1f} MB with the bf16 hook); fp32, max_seq_len {config.max_seq_len}, per-rank batch "
          f"{config.per_rank_batch_size}, 1 micro-batch per step; 2 gloo ranks in 2 network namespaces over a veth "
          f"pair shaped by tc; {args.steps} step(s) per repeat")
    rows, ratios = [], {}
    for rate, by_hook in figures.items():
        for hook in HOOKS:
            wire = "" if rate is None else \
                f"; wire time {megabytes * (1 if hook == 'none' else 0.5) * 8 / rate * 1000:.0f} ms"
            rows.append((f"{link_name(rate, args.delay_ms):<18} {hook}", f"{1000 * median(by_hook[hook]):.1f} ms/step",
                         spread([1000 * v for v in by_hook[hook]]) + wire))
        ratios[rate] = median(by_hook["none"]) / median(by_hook["bf16"])
    print_table("time per optimizer step (median, slower rank); wire time = gradient bytes / link rate:", rows)
    # C, the step without the all-reduce's wire time: the unthrottled step (its all-reduce takes a few ms).
    compute = median(figures[None]["none"])
    for rate, ratio in ratios.items():
        note = "" if rate is None else (
            f"   (fp32 wire time / compute {megabytes * 8 / rate / compute:.1f}; with no overlap "
            f"(C + W) / (C + W/2) = {(compute + megabytes * 8 / rate) / (compute + megabytes * 4 / rate):.2f})")
        print(f"  none / bf16 on {link_name(rate, args.delay_ms)}: {ratio:.3f}{note}")
    first, last = {hook: values[0] for hook, values in losses.items()}, {hook: v[-1] for hook, v in losses.items()}
    loss_difference = abs(last["bf16"] - last["none"]) / last["none"]
    print(f"loss check ({args.loss_steps} steps from the same weights and seed, unthrottled): none "
          f"{first['none']:.5f} -> {last['none']:.5f}, bf16 {first['bf16']:.5f} -> {last['bf16']:.5f} "
          f"(relative difference {loss_difference:.1e})")
    slowest = args.rates[-1]
    print_targets([
        Target(f"none / bf16 at the slowest link ({link_name(slowest, args.delay_ms)}), time per step",
               ratios[slowest], SLOW_TARGET, at_most=False),
        Target(f"none / bf16 on the {link_name(None, args.delay_ms)}, time per step", ratios[None], FAST_TARGET,
               at_most=False),
        Target(f"loss after {args.loss_steps} steps, 1 + |bf16 - none| / none", 1 + loss_difference, 1 + LOSS_TARGET,
               at_most=True),
    ])


if __name__ == "__main__":
    main()
