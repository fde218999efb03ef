r"""One command, N-node DDP training on the Apolo (ex-Neu.ro) platform: checks the platform job name of
every node, starts the master job, waits until it runs and reads its internal hostname, starts the
N-1 worker jobs pointed at it all at once (all jobs of .neuro/live.yml's `distributed_training`,
sharing one run id), streams the master's logs, and kills every job of the run as soon as one
fails or you press Ctrl-C. With --external-store a CPU job (`rendezvous_store`) hosts the rendezvous
instead: it starts first, and all N nodes then start together pointed at it. Works from any directory
(the flow CLI runs in the repository).

Usage:
  scripts/run_distributed_on_platform.sh [--nodes N] [--min-nodes MIN] [--max-resubmits K] [--preset NAME]
      [--external-store] [--store-preset NAME]
      [--run-id ID] [--port P] [--max-restarts R] [--life-span SPAN] [--timeout S] [--poll S] [--entry-module M]
      [--tracker none|mlflow] [--mlflow-uri URI] [--mlflow-token secret:NAME] [--dry-run] [--] [TRAINER ARGS...]

  scripts/run_distributed_on_platform.sh --nodes 2                       # DummyDataset, tiny model
  scripts/run_distributed_on_platform.sh --nodes 4 --preset gpu-large -- --preset bert-base
  scripts/run_distributed_on_platform.sh --nodes 4 -- --preset NAME
                                            # a preset's task, after `neuro-flow run prepare` (docs/PLATFORM.md)
  scripts/run_distributed_on_platform.sh --run-id dq-0612 -- --preset bert-base   # resume that run
  scripts/run_distributed_on_platform.sh --nodes 4 --min-nodes 3 --external-store -- --preset bert-base
                                            # elastic: the loss of any node, node 0 too, leaves the run going

Before the first run: neuro-flow build myimage; neuro-flow mkvolumes; neuro-flow upload ALL.

Options:
  --nodes N          jobs (nodes) in the run; default: $NODES, else NODES= in .env, else 2
  --min-nodes MIN    elastic (worker.sh --min-nodes; default: $MIN_NODES, else .env, else N): the run goes
                     on while MIN jobs are alive. A job that fails or is cancelled then does not end the
                     run: the others resume at the smaller world size, and the launcher submits that
                     node's job again (same arguments, same node rank; --max-resubmits), whose worker
                     joins the next rendezvous round: the run grows back (docs/FAULT_TOLERANCE.md).
                     Node 0 hosts the rendezvous store: its job is not submitted again, and its loss ends
                     the run, unless --external-store
  --max-resubmits K  with --min-nodes below --nodes: submit each node's job again at most K times
                     (default 3; 0: never); after that the run goes on without the node while MIN
                     jobs are alive. Without a range a failed job ends the run, as ever
  --preset NAME      resource preset of every node; default: $PLATFORM_PRESET, .env, else gpu-small
  --external-store   host the rendezvous store in a CPU job of its own (`rendezvous_store <run id>`, running
                     python -m distqa.launch.rendezvous_store --port P), submitted before the nodes and killed at the
                     end, instead of on node 0 (default: $EXTERNAL_STORE, .env, else 0; 1 = on). Use it with
                     --min-nodes: node 0 is then a node like any other, whose job is submitted again when
                     lost. It costs one small CPU job for the run's length; losing that job ends the run
  --store-preset P   resource preset of the store's job (default: $STORE_PRESET, .env, else cpu-small)
  --run-id ID        job suffix, rendezvous id and run directory (results/ID); the same id
                     resumes that run. Default: dq-<UTC date-time>. Lowercase letters and digits
                     in groups joined by single '-'; short enough that every node's platform job
                     name (<project id>-distributed-training-<ID>-<node>, cut as neuro-flow cuts
                     it) fits the platform's 40 characters: at most 15 characters below 10 nodes.
  --port P           rendezvous port on the master, or on the store's job (default 29400)
  --max-restarts R   torchrun restarts of every worker from the newest checkpoint after one fails,
                     inside the jobs (default 3: a crashed process costs a restart, not the run; a
                     job that ends still ends the run; docs/FAULT_TOLERANCE.md "Restart defaults")
  --life-span SPAN   each job is killed by the platform after SPAN (default 1d): a safety net.
                     As neuro-flow reads it: [Nd][Nh][Nm][Ns] in that order (1d, 6h, 1d12h, 90m)
                     or a number of seconds (3600)
  --timeout S        seconds the platform may take to start each node (default 900: autoscaled
                     GPU nodes can take minutes); a node not started by then fails (the job's
                     schedule_timeout) and the run stops. The master's rendezvous waits S + 300 s
                     for the others to join, so a worker queued up to S still makes it.
  --poll S           seconds between status checks of the jobs (default 15)
  --entry-module M   the module every process of every node runs (python -m M; default distqa.train):
                     a fork's own entry point (worker.sh --entry-module); the image must hold it
  --tracker T        'mlflow': rank 0 logs the run to the MLflow server at --mlflow-uri (one MLflow run
                     across restarts; docs/PLATFORM.md "Tracking with MLflow"); default: DISTQA_TRACKER
                     (environment or .env), else none
  --mlflow-uri URI   the MLflow tracking server, e.g. the platform's MLflow app; default: MLFLOW_TRACKING_URI
                     (environment or .env)
  --mlflow-token S   a platform secret holding the server's token, as secret:NAME (`apolo secret add NAME
                     TOKEN`); the jobs get it as MLFLOW_TRACKING_TOKEN. Default: MLFLOW_TOKEN_SECRET
                     (environment or .env), else none. Never the token itself: job params are visible
  --dry-run          print the commands instead of running them
Arguments after -- go to the trainer (python -m distqa.train, or --entry-module) on every node; a fork's
task is one of them: -- --task examples.text_classification.task:TextClassification.

Environment: FLOW_CLI (apolo-flow or neuro-flow; default: whichever is installed, apolo-flow
first), NODES, MIN_NODES, PLATFORM_PRESET, EXTERNAL_STORE, STORE_PRESET, RUN_ID, SCHEDULE_TIMEOUT,
POLL_INTERVAL; ENV_FILE (default .env in the working directory, as for every script and entry point: NODES=,
MIN_NODES=, PLATFORM_PRESET=, EXTERNAL_STORE= and STORE_PRESET= are read from it); PYTHON, the interpreter the
script runs this launcher with (python -m distqa.launch.platform; default: the repository's .venv/bin/python, else
python3; it needs python-dotenv).
Exit status: 0 when every node succeeded; 1 when a job failed or never started, or the store's job
ended (all jobs of the run are killed first); 2 for a usage error; 130 after Ctrl-C or SIGTERM (all
jobs killed: each job's worker.sh gets SIGTERM from the platform, so its workers checkpoint the step
reached and stop within the platform's grace period; run again with the same --run-id to resume).
"""

# The text above is `scripts/run_distributed_on_platform.sh --help` (the script is a shim that runs this package:
# python -m distqa.launch.platform). Below: its options, read as the script always read them, and checked before
# anything is submitted.

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from dotenv import dotenv_values

from distqa.launch.node_options import MODULE_NAME, read_flags, seconds_of

PROG = "run_distributed_on_platform.sh"
"""The name usage errors start with: the documented command."""
JOIN_MARGIN_S = 300
"""Seconds the master's rendezvous waits beyond --timeout: image pull, container start, python imports."""
RUN_ID = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
SECRET = re.compile(r"secret:[A-Za-z0-9_-]+")


class UsageError(Exception):
    """A bad option or setting: one line after ``run_distributed_on_platform.sh:``, exit status 2."""


@dataclass
class Options:
    """One launch, as the user asked for it (flags > environment > .env > defaults)."""

    nodes: int
    min_nodes: int
    preset: str
    external_store: bool
    store_preset: str
    run_id: str
    port: int = 29400
    max_restarts: int = 3
    max_resubmits: int = 3
    life_span: str = "1d"
    timeout_s: int = 900
    poll_s: float = 15.0
    entry_module: str = "distqa.train"
    tracker: str = "none"
    mlflow_uri: str = ""
    mlflow_token: str = ""
    dry_run: bool = False
    trainer_args: list[str] = field(default_factory=list)

    @property
    def join_timeout_s(self) -> int:
        """The master's rendezvous join timeout: a worker queued up to --timeout still makes it."""
        return self.timeout_s + JOIN_MARGIN_S

    @property
    def elastic(self) -> bool:
        """A node range: a lost job is submitted again while --min-nodes others go on."""
        return self.min_nodes < self.nodes


def env_file(environ: Mapping[str, str]) -> Path:
    """The .env every entry point and script reads (distqa.config.sources.dotenv_file, scripts/common.sh):
    ``$ENV_FILE``, refused when it names no file, else ``.env`` in the working directory."""
    named = environ.get("ENV_FILE")
    if named and not Path(named).is_file():
        raise UsageError(f"ENV_FILE={named}: no such file; name an existing file, or unset ENV_FILE to read .env in "
                         "the working directory")
    return Path(named or ".env")


_DEFAULTS = {"nodes": "2", "min_nodes": "", "preset": "gpu-small", "external_store": "0", "store_preset": "cpu-small",
             "run_id": "", "port": "29400", "max_restarts": "3", "max_resubmits": "3", "life_span": "1d",
             "timeout": "900", "poll": "15", "entry_module": "distqa.train", "tracker": "none", "mlflow_uri": "",
             "mlflow_token": ""}
"""Every option's default, as text, by its flag's name (--max-restarts: max_restarts)."""
_VARIABLES = {"nodes": "NODES", "min_nodes": "MIN_NODES", "preset": "PLATFORM_PRESET",
              "external_store": "EXTERNAL_STORE", "store_preset": "STORE_PRESET", "tracker": "DISTQA_TRACKER",
              "mlflow_uri": "MLFLOW_TRACKING_URI", "mlflow_token": "MLFLOW_TOKEN_SECRET", "run_id": "RUN_ID",
              "timeout": "SCHEDULE_TIMEOUT", "poll": "POLL_INTERVAL"}
"""The variables that give an option's default instead."""
_ENVIRONMENT_ONLY = ("RUN_ID", "SCHEDULE_TIMEOUT", "POLL_INTERVAL")
_VALUED = {f"--{name.replace('_', '-')}": name for name in _DEFAULTS if name != "external_store"}
_SWITCHES: dict[str, tuple[str, str | bool]] = {"--external-store": ("external_store", "1"),
                                                "--dry-run": ("dry_run", True)}


def settings(environ: Mapping[str, str]) -> dict[str, str]:
    """Each option's value before the flags: its variable's in the environment, else in the .env file (read by
    python-dotenv, as the trainer reads it), else its default; an empty value counts as unset. RUN_ID,
    SCHEDULE_TIMEOUT and POLL_INTERVAL come from the environment alone."""
    path = env_file(environ)
    from_file = dotenv_values(path) if path.is_file() else {}
    given = {name: environ.get(variable) or (from_file.get(variable) if variable not in _ENVIRONMENT_ONLY else "")
             for name, variable in _VARIABLES.items()}
    return {**_DEFAULTS, **{name: value for name, value in given.items() if value}}


def whole(name: str, value: str) -> int:
    """``value`` as a whole number; else a :class:`UsageError` naming ``name``."""
    if not re.fullmatch(r"[0-9]+", value):
        raise UsageError(f"{name} must be a whole number, got '{value}' (flag, environment or .env)")
    return int(value)


def parse_options(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Options | None:
    """The launch ``argv`` asks for, or None for --help; a :class:`UsageError` names the first bad value."""
    try:
        read = read_flags(argv, _VALUED, _SWITCHES)
    except ValueError as err:
        raise UsageError(str(err)) from err
    if read is None:
        return None
    flags, trainer_args = read
    if empty := next((flag for flag, name in _VALUED.items() if flags.get(name) == ""), None):
        raise UsageError(f"{empty} needs a value (see --help)")
    raw = SimpleNamespace(**{**settings(os.environ if environ is None else environ), **flags})
    raw.run_id = raw.run_id or time.strftime("dq-%m%d-%H%M%S", time.gmtime())
    nodes = whole("nodes", raw.nodes)
    min_nodes = whole("min_nodes", raw.min_nodes or raw.nodes)
    port, max_restarts = whole("port", raw.port), whole("max_restarts", raw.max_restarts)
    max_resubmits, timeout_s = whole("max_resubmits", raw.max_resubmits), whole("timeout_s", raw.timeout)
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", raw.poll):
        raise UsageError(f"--poll must be a number of seconds, got '{raw.poll}'")
    if raw.external_store not in ("0", "1"):
        raise UsageError(f"EXTERNAL_STORE must be 0 or 1 (1: --external-store), got '{raw.external_store}' "
                         "(environment or .env)")
    external_store = raw.external_store == "1"
    checks = (
        (not external_store or nodes > 1,
         "--external-store needs --nodes 2 or more: one node has no rendezvous to host"),
        (nodes >= 1, f"--nodes must be at least 1, got {nodes}"),
        (1 <= min_nodes <= nodes, f"--min-nodes must be in 1..{nodes} (--nodes), got {min_nodes}"),
        (1024 <= port <= 65535, f"--port must be in 1024..65535, got {port}"),
        (timeout_s >= 1, f"--timeout must be at least 1 second, got {timeout_s}"),
        (MODULE_NAME.fullmatch(raw.entry_module),
         f"--entry-module must be a dotted Python module name such as mytask.train, got '{raw.entry_module}'"),
        (raw.tracker in ("none", "mlflow"), f"--tracker must be none or mlflow, got '{raw.tracker}'"),
        (raw.tracker == "none" or raw.mlflow_uri,
         "--tracker mlflow needs --mlflow-uri (or MLFLOW_TRACKING_URI in the environment or .env)"),
        (not raw.mlflow_token or SECRET.fullmatch(raw.mlflow_token),
         "--mlflow-token must name a platform secret as secret:NAME (not the token itself: job params are visible)"),
        (RUN_ID.fullmatch(raw.run_id), "--run-id must be lowercase letters and digits in groups joined by single '-' "
                                       f"(it becomes part of job names), got '{raw.run_id}'"),
        (seconds_of(raw.life_span) is not None,
         f"--life-span must be [Nd][Nh][Nm][Ns] in that order (1d, 6h, 1d12h, 90m) or seconds (3600), got "
         f"'{raw.life_span}'"),
    )
    for ok, message in checks:
        if not ok:
            raise UsageError(message)
    return Options(nodes=nodes, min_nodes=min_nodes, preset=raw.preset, external_store=external_store,
                   store_preset=raw.store_preset, run_id=raw.run_id, port=port, max_restarts=max_restarts,
                   max_resubmits=max_resubmits, life_span=raw.life_span, timeout_s=timeout_s, poll_s=float(raw.poll),
                   entry_module=raw.entry_module, tracker=raw.tracker, mlflow_uri=raw.mlflow_uri,
                   mlflow_token=raw.mlflow_token, dry_run=flags.get("dry_run") is True, trainer_args=trainer_args)
