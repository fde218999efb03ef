"""The platform launcher's entry point: ``scripts/run_distributed_on_platform.sh`` execs it (the same options)::

    python -m distqa.launch.platform --nodes 2 [--min-nodes 1 --external-store] [-- TRAINER ARGS...]

Its options, environment and exit statuses: ``--help`` (:mod:`distqa.launch.platform.options`). Exit statuses: 0
every node succeeded; 1 a job failed or never started, or the store's job ended; 2 a usage error; 130 Ctrl-C or
SIGTERM (every job of the run killed first, in both cases).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from distqa.launch.platform import options as usage
from distqa.launch.platform.jobs import (
    JOB,
    STORE_JOB,
    Flow,
    FlowMissingError,
    find_flow_cli,
    job_name,
    project_id,
    valid_job_name,
)
from distqa.launch.platform.options import PROG, Options, UsageError, parse_options
from distqa.launch.platform.run import Launch, LaunchInterruptedError, RunFailedError, log, signals_ignored

REPO_ROOT = Path(__file__).resolve().parents[4]
"""The checkout whose .neuro/ the flow CLI reads (src/distqa/launch/platform/cli.py → the repository)."""


def check_job_names(options: Options, repo_root: Path) -> None:
    """Refuse a run id that makes any job's name one the platform refuses (every node's, the longest suffix first,
    and the store's), before any job is submitted: otherwise nodes 0..9 start and node 10 is refused."""
    project = project_id(repo_root)
    if not project:
        raise UsageError(f"no 'id:' in {repo_root}/.neuro/project.yml: the project id names the jobs")
    for rank in reversed(range(options.nodes)):
        name = job_name(project, JOB, f"{options.run_id}-{rank}")
        if not valid_job_name(name):
            longest = 38 - len(JOB) - 1 - len(str(rank)) - 1
            raise UsageError(f"node {rank}'s job name '{name}' is not a valid platform job name (at most 40 "
                             f"characters, ^[a-z][a-z0-9]*(-[a-z0-9]+)*$); with {options.nodes} nodes use a --run-id "
                             f"of at most {longest} characters")
    if options.external_store:  # shorter than every node's name, but its own job id: checked all the same
        name = job_name(project, STORE_JOB, options.run_id)
        if not valid_job_name(name):
            raise UsageError(f"the store's job name '{name}' is not a valid platform job name (at most 40 "
                             "characters); use a shorter --run-id")


def dry_run_lines(flow: Flow) -> list[str]:
    """What the launch would run, one command a line, in order."""
    o, cli = flow.options, flow.cli
    if o.external_store:
        return [shlex.join(flow.store_command()) + " &",
                f"{cli} status {STORE_JOB} {o.run_id}   # until running; read its Internal Hostname",
                *(shlex.join(flow.node_command(rank, "<store-internal-hostname>")) + " &   # nodes 0..N-1 all at once"
                  for rank in range(o.nodes)),
                f"{cli} logs {JOB} {flow.suffix(0)}",
                f"{cli} ps   # each --poll seconds: every job's status in one listing",
                f"# at the end (and on failure or Ctrl-C): for every node I: {cli} kill {JOB} {o.run_id}-I; then "
                f"{cli} kill {STORE_JOB} {o.run_id}"]
    return [shlex.join(flow.node_command(0, "")) + " &",
            f"{cli} status {JOB} {flow.suffix(0)}   # until running; read its Internal Hostname",
            *(shlex.join(flow.node_command(rank, "<master-internal-hostname>")) + " &   # nodes 1..N-1 all at once"
              for rank in range(1, o.nodes)),
            f"{cli} logs {JOB} {flow.suffix(0)}",
            f"{cli} ps   # each --poll seconds: every job's status in one listing",
            f"# on failure or Ctrl-C, for every node I: {cli} kill {JOB} {o.run_id}-I"]


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None,
         repo_root: Path = REPO_ROOT) -> int:
    """Launch (or, with --dry-run, print) a run; the exit status."""
    environ = os.environ if environ is None else environ
    try:
        options = parse_options(sys.argv[1:] if argv is None else argv, environ)
        if options is None:
            print(usage.__doc__, end="")
            return 0
        check_job_names(options, repo_root)
        cli = (environ.get("FLOW_CLI") or "neuro-flow") if options.dry_run else find_flow_cli(environ)
    except UsageError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 2
    except FlowMissingError as error:
        print(error, file=sys.stderr)
        return 2
    flow = Flow(cli, options, repo_root)
    if options.dry_run:
        print("\n".join(dry_run_lines(flow)))
        return 0
    launch = Launch(flow)
    try:
        launch.run()
    except RunFailedError as failure:
        with signals_ignored():
            log(str(failure))
            log(f"stopping every job of run '{options.run_id}'")
            launch.kill_all()
        return 1
    except LaunchInterruptedError:
        with signals_ignored():
            log(f"interrupted: killing every job of run '{options.run_id}' (a second Ctrl-C changes nothing)")
            launch.kill_all()
            # The platform deletes each job's pod: SIGTERM to its main process, worker.sh, which passes it on to the
            # workers (a checkpoint of the step reached, exit 75), and SIGKILL after the grace period.
            log("each job got SIGTERM: its workers checkpoint the step they reach and stop; run again with --run-id "
                f"{options.run_id} to resume ('{cli} logs {JOB} {flow.suffix(0)}' shows node 0's last lines)")
        return 130
    return 0
