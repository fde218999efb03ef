"""A stand-in for the platform CLIs (neuro-flow / apolo-flow) that runs jobs as local processes.

The tests put wrappers named ``neuro-flow`` and ``apolo-flow`` that exec this file first on ``PATH``;
``scripts/run_distributed_on_platform.sh`` then drives it exactly as it drives the real CLI.

What is real, and which function of the real CLI each behaviour follows (neuro-flow 24.12 and
apolo-flow 26.7 both ship the package ``apolo_flow``; the platform client is ``apolo_cli`` /
``apolo_sdk``). The stand-in runs under either: it uses whichever ``apolo_flow`` its interpreter has.

* the workspace is found from the working directory upwards, ``.apolo/`` before ``.neuro/``
  (``apolo_flow.parser.find_workspace``, as ``apolo_flow.cli.main`` calls it): run from outside a
  checkout, the stand-in fails as the real CLI does;
* each job is rendered from ``live.yml`` by neuro-flow's own code (``apolo_flow.context.RunningLiveFlow``:
  params with their defaults, env, volumes, schedule timeout, the command), the command line is
  parsed with the real option syntax (click: ``run JOB --suffix S --param K V``), and the command
  is split with ``shlex`` as ``apolo_flow.live_runner.LiveExecutor.run`` does before handing it to
  ``apolo run``;
* the job name is built as ``LiveExecutor.run`` builds it (project id, ``-``, job id and suffix with
  ``_`` turned into ``-``, the project id cut so the whole fits 40 characters) and checked with the
  real ``apolo_cli.click_types.JOB_NAME`` (``^[a-z][a-z0-9]*(?:-[a-z0-9]+)*$``, 3..40 characters):
  a name the platform would refuse is refused here, before anything starts;
* ``run`` waits while the job is pending, polling its status, as ``apolo_cli.job.run_job`` does
  (``--wait-start`` is the default and neuro-flow never turns it off), and exits with the job's
  exit code, or 125 (``apolo_cli.const.EX_PLATFORMERROR``), when the job failed before running;
  a non-detached job is then followed to its end (``apolo attach`` with logs);
* a job still pending after its ``schedule_timeout`` fails, as the platform fails a job it could
  not schedule in time (``apolo run --schedule-timeout``, which ``LiveExecutor.run`` passes);
* ``build IMAGE`` refuses to overwrite an existing image tag without ``-F/--force-overwrite`` or
  ``force_rebuild: true`` in live.yml (``apolo_flow.live_runner.LiveExecutor.build`` passes
  ``--force-overwrite`` for either; ``apolo_extras.image._build_image`` refuses otherwise), and
  uploads its context the way ``apolo cp --recursive`` does (``apolo_sdk.Storage.upload_dir`` with
  the ignore files ``.apoloignore`` / ``.neuroignore`` of ``apolo_cli.storage.calc_ignore_file_names``);
* ``upload VOLUME`` copies with the same ignore-file logic (``LiveExecutor.upload`` runs
  ``apolo cp --recursive --update``).
* ``mkvolumes`` creates only the volumes that have a local folder (``LiveExecutor.mkvolumes``);
* ``status`` prints the rows scripts read from ``apolo status`` (``apolo_cli.formatters.jobs.
  JobStatusFormatter``: ``Job``, ``Status`` with the reason in parentheses, ``Exit code`` once the job failed
  or succeeded, and ``Internal Hostname`` once the job has one), reached through
  ``LiveExecutor.status``; ``logs`` follows the output to the end (``LiveExecutor.logs`` ->
  ``apolo logs``); ``kill JOB [SUFFIX]`` / ``kill ALL`` (``LiveExecutor.kill_job`` / ``kill_all``: the
  client's ``DELETE /jobs/ID``, then a wait until the job's status is terminal) return once the job is
  ``cancelled``, which the platform records at once (platform-api ``JobsService.cancel_job``), while the
  job's processes are still stopping (below);
* ``ps`` prints what ``apolo_flow.live_runner.LiveRunner.ps`` prints (``apolo_flow.cli.live.ps``): it runs that very
  code, the flow loaded from live.yml by ``LiveRunner.init_flow`` and the console made as
  ``apolo_flow.cli.main.MainGroup._process_args`` makes it (so ``$COLUMNS`` sets its width, as for the real CLI),
  with the platform's job list (``apolo_sdk.Jobs.list``: jobs carrying every tag asked for, in the statuses asked
  for, created since ``since``, newest first with ``reverse``, at most ``limit``) answered from the stand-in's
  records. The stand-in keeps the newest job under each name only; ``LiveRunner._job_status`` shows only the newest
  per suffix (a live job first, then the newest that ended), so the listing is the real one.

What stands in for the platform:

* a job is a local process tree under a supervisor (a child subreaper, so no process of the job
  outlives ``kill``, however it daemonises), in the state directory ``$STANDIN_PLATFORM_DIR``;
* a killed job is stopped as its pod is deleted: platform-api's poller deletes a cancelled job's pod
  (``KubeOrchestrator.delete_job`` -> ``kube_client.delete_pod`` without ``force``, and the pod spec sets no
  ``terminationGracePeriodSeconds``), so Kubernetes sends SIGTERM to the container's main process (the
  job's command: ``bash /project/scripts/worker.sh …``) alone and SIGKILLs whatever is left after its
  default grace period of 30 s (``$STANDIN_GRACE_S``); once the main process has ended the container's
  other processes end with it;
* every job gets its own address, a loopback alias 127.0.0.<10+n>, shown as its Internal
  Hostname; the job sees it as ``NODE_ADDR`` (its "pod IP") and ``GLOO_SOCKET_IFNAME=lo``. Which address the
  platform gives a job is not the user's to choose, and jobs submitted together get theirs in any order; a
  test that needs an order (torch's c10d rendezvous ranks the nodes by address:
  ``dynamic_rendezvous._DistributedRendezvousOpExecutor._mark_rendezvous_complete`` sorts the participants'
  ``_NodeDesc(addr, pid, local_id)``) writes the address into ``$STANDIN_PLATFORM_DIR/address/<job id>-<suffix>``:
  every job submitted under that name then gets it;
* container paths are rewritten to local ones: each volume's mount path to its storage folder
  ``$STANDIN_PLATFORM_DIR/storage/<path of the storage: URI>``, and ``/project`` (the image's copy of
  the repository) to this checkout; ``python`` is the interpreter running this file;
* a job whose main process ends non-zero fails with that exit code, 128 + N for a process killed by signal N
  (as the container runtime reports it), and the reason ``Error`` (Kubernetes' reason for such a container);
  ``run`` with the suffix of a job that has ended submits a new job (a new id) under the same name;
* a job is ``pending`` for ``$STANDIN_PENDING_S`` seconds (default 1: the time the platform takes
  to find a node) before it starts, then ``running``, then ``succeeded``, ``failed`` or ``cancelled``;
* a job also stays ``pending`` while the file ``$STANDIN_PLATFORM_DIR/held/<job id>-<suffix>`` exists (the
  platform has no free node for it until a test removes the file); its schedule timeout still fails it;
* ``run``'s view of its job is stale while the file ``$STANDIN_PLATFORM_DIR/late/<job id>-<suffix>`` exists: its
  next status reply has not come (the real CLI asks the platform over the network every 0.2 s), so a job can
  start and end before its ``run`` returns, and that ``run`` then exits with the job's own exit code;
* every submission and every change of a job's status is one line of
  ``$STANDIN_PLATFORM_DIR/events.jsonl``, in the order they happened (tests assert on this order, never on
  how long anything took);
* images are records in ``$STANDIN_PLATFORM_DIR/images``; a build runs no Dockerfile;
* a job's command is the shell line in ``$STANDIN_PLATFORM_DIR/command/<job id>-<suffix>`` (else
  ``command/<job id>``) when a test wrote one, run with ``bash -c`` in the job's environment: a light job for a test
  about the control plane (the launcher's polls), where the rendered command would start a trainer per node;
* every invocation of the CLI is one line of ``$STANDIN_PLATFORM_DIR/calls.jsonl`` (its subcommand and arguments,
  in order), so a test can count the CLI processes a launcher starts.

Subcommands: run, status, logs, kill (JOB [SUFFIX] or ALL), ps, mkvolumes, upload (VOLUME or ALL),
build IMAGE.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import inspect
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import types
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from yarl import URL

IMAGE_ROOT = "/project"
TERMINAL = {"succeeded", "failed", "cancelled"}
EX_PLATFORMERROR = 125  # apolo_cli.const.EX_PLATFORMERROR: `apolo run` exits with it when a job fails to start
PR_SET_CHILD_SUBREAPER = 36  # prctl option: orphaned descendants are reparented to this process


def state_dir() -> Path:
    raw = os.environ.get("STANDIN_PLATFORM_DIR")
    if not raw:
        raise click.ClickException("STANDIN_PLATFORM_DIR is not set: the stand-in keeps its jobs there")
    path = Path(raw)
    (path / "jobs").mkdir(parents=True, exist_ok=True)
    return path


# --- rendering with neuro-flow's own code ----------------------------------------------------

class _Parse:
    """client.parse of apolo_sdk, reduced to what rendering needs: storage:/image: strings → URIs."""

    def str_to_uri(self, value: str, **_: Any) -> URL:
        scheme, _, path = value.partition(":")
        return URL.build(scheme=scheme, host="standin", path="/" + path.lstrip("/"))


class _Client:
    config = types.SimpleNamespace(project_name_or_raise="standin", project_name="standin",
                                   username="standin", org_name="standin", cluster_name="standin")
    parse = _Parse()


def workspace() -> Any:
    """The checkout the CLI works on: found from the working directory up (apolo_flow.parser.find_workspace)."""
    from apolo_flow.parser import find_workspace

    try:
        return find_workspace(None)
    except ValueError as error:  # apolo_flow.cli.main turns this into a usage error too
        raise click.UsageError(str(error)) from None


def repo_root() -> Path:
    return Path(workspace().workspace)


def _flow() -> Any:
    from apolo_flow.config_loader import LiveLocalCL
    from apolo_flow.context import RunningLiveFlow

    loader = LiveLocalCL(workspace(), _Client())  # type: ignore[arg-type]
    return asyncio.run(RunningLiveFlow.create(loader, "live"))


def job_name(project_id: str, job_id: str, suffix: str | None) -> str:
    """The platform job name neuro-flow gives a live job (apolo_flow.live_runner.LiveExecutor.run)."""
    first_part = project_id.replace("_", "-").strip("-")
    while "--" in first_part:
        first_part = first_part.replace("--", "-")
    second_part = job_id if suffix is None else f"{job_id}-{suffix}"
    second_part = second_part.replace("_", "-").strip("-")
    while "--" in second_part:
        second_part = second_part.replace("--", "-")
    first_part = first_part[: 40 - len(second_part) - 1]
    name = first_part + "-" + second_part
    while "--" in name:
        name = name.replace("--", "-")
    return name


def check_job_name(name: str) -> None:
    """`apolo run --name` converts the name with apolo_cli.click_types.JOB_NAME; refuse what it refuses."""
    from apolo_cli.click_types import JOB_NAME

    try:
        JOB_NAME.convert(name, None, None)
    except ValueError as error:
        raise click.UsageError(f"Invalid value for '-n' / '--name': {error}") from None


def render(job_id: str, suffix: str | None, params: dict[str, str]) -> Any:
    flow = _flow()
    if job_id not in flow.job_ids:
        raise click.ClickException(f"unknown job {job_id!r}; live.yml has {sorted(flow.job_ids)}")

    async def get() -> Any:
        if await flow.is_multi(job_id):
            if suffix is None:
                raise click.ClickException(f"{job_id} is a multi-job: pass --suffix")
            # neuro-flow 24.12: get_multi_job(job_id, suffix, args, params) (the `run JOB -- ARGS` of
            # multi.args); apolo-flow 26.7 dropped both: get_multi_job(job_id, suffix, params).
            if "args" in inspect.signature(flow.get_multi_job).parameters:
                return await flow.get_multi_job(job_id, suffix, None, params)
            return await flow.get_multi_job(job_id, suffix, params)
        return await flow.get_job(job_id, params)

    return asyncio.run(get())


def storage_path(uri: str) -> Path:
    """storage://standin/<path> → the stand-in's storage folder for <path>."""
    parsed = URL(uri)
    return state_dir() / "storage" / parsed.path.lstrip("/")


def mounts_of(volumes: list[str]) -> dict[str, Path]:
    mounts = {}
    for volume in volumes:
        uri, mount, _mode = volume.rsplit(":", 2)
        local = storage_path(uri)
        local.mkdir(parents=True, exist_ok=True)
        mounts[mount] = local
    return mounts


def rewrite(value: str, mounts: dict[str, Path]) -> str:
    """Container paths → local paths, longest mount first; /project (the image) → the checkout."""
    table = {**{m: str(p) for m, p in mounts.items()}, IMAGE_ROOT: str(repo_root())}
    for mount in sorted(table, key=len, reverse=True):
        value = re.sub(rf"(?<![\w/.-]){re.escape(mount)}(?=/|$|[^\w.-])", lambda _m, t=table[mount]: t, value)
    return value


# --- job records -----------------------------------------------------------------------------

def key_of(job_id: str, suffix: str | None) -> str:
    return job_id if suffix is None else f"{job_id}-{suffix}"


def record_path(key: str) -> Path:
    return state_dir() / "jobs" / f"{key}.json"


def read_record(key: str) -> dict[str, Any] | None:
    path = record_path(key)
    return json.loads(path.read_text()) if path.exists() else None


def write_record(key: str, record: dict[str, Any]) -> None:
    path = record_path(key)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(path)


def update_record(key: str, **changes: Any) -> None:
    record = read_record(key) or {}
    if record.get("status") == "cancelled" and changes.get("status") in TERMINAL:
        changes.pop("status")  # a killed job stays cancelled
    # The job's history as the platform keeps it (apolo_sdk.JobStatusHistory): when it started, when it ended.
    if changes.get("status") == "running":
        changes["started_at"] = time.time()
    elif changes.get("status") in TERMINAL and record.get("status") not in TERMINAL:
        changes["finished_at"] = time.time()
    write_record(key, {**record, **changes})
    if "status" in changes and changes["status"] != record.get("status"):
        note_event(key, changes["status"], **({"reason": changes["reason"]} if "reason" in changes else {}))


def held(key: str) -> bool:
    """Whether a test holds the job pending: the platform has no node for it yet."""
    return (state_dir() / "held" / key).exists()


def late(key: str) -> bool:
    """Whether a test holds back the status reply ``run`` waits for: the job may have moved on meanwhile."""
    return (state_dir() / "late" / key).exists()


def note_event(key: str, event: str, **details: Any) -> None:
    """One line in events.jsonl for a submission or a status change."""
    append_line("events.jsonl", {"key": key, "event": event, **details})


def read_events() -> list[dict[str, Any]]:
    return read_lines("events.jsonl")


def append_line(name: str, record: dict[str, Any]) -> None:
    """``record`` as one line at the end of the state directory's ``name``. A single write(2) to a file opened with
    O_APPEND puts each line whole at the end, so the file's order is the order in which the processes of the
    stand-in (CLI calls, supervisors) saw the events happen."""
    fd = os.open(state_dir() / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def read_lines(name: str) -> list[dict[str, Any]]:
    path = state_dir() / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def all_records() -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((state_dir() / "jobs").glob("*.json"))]


def pinned_address(key: str) -> str | None:
    """The address a test gave the job's name (``address/<key>``), if any."""
    path = state_dir() / "address" / key
    return path.read_text().strip() if path.exists() else None


def next_address() -> str:
    used = {r["hostname"] for r in all_records()}
    for n in range(10, 250):
        if f"127.0.0.{n}" not in used:
            return f"127.0.0.{n}"
    raise click.ClickException("the stand-in ran out of loopback addresses")


# --- the CLI ---------------------------------------------------------------------------------

@click.group()
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Stand-in for neuro-flow / apolo-flow: runs live.yml jobs as local processes (tests only)."""
    if ctx.invoked_subcommand != "_supervise":  # the platform's side of a job, not a CLI process of the user's
        note_call(ctx.invoked_subcommand or "", sys.argv[2:])


def note_call(command: str, args: list[str]) -> None:
    """One line in calls.jsonl per CLI process."""
    append_line("calls.jsonl", {"command": command, "args": args})


def read_calls() -> list[dict[str, Any]]:
    """Every CLI process started so far: its subcommand and arguments, in order."""
    return read_lines("calls.jsonl")


@cli.command()
@click.option("-s", "--suffix")
@click.option("-p", "--param", type=(str, str), multiple=True)
@click.option("--dry-run", is_flag=True, default=False)
@click.argument("job-id")
@click.argument("args", nargs=-1)
def run(job_id: str, suffix: str | None, param: list[tuple[str, str]], dry_run: bool, args: tuple[str, ...]) -> None:
    params = dict(param)
    job = render(job_id, suffix, params)
    check_job_name(job_name(_flow().project.id, job_id, suffix))
    key = key_of(job_id, suffix)
    existing = read_record(key)
    if existing and existing["status"] not in TERMINAL:
        raise click.ClickException(f"job {key} is already {existing['status']}")
    mounts = mounts_of(job.volumes)
    command = [rewrite(arg, mounts) for arg in shlex.split(job.cmd or "")]
    if command and command[0] in ("python", "python3"):
        command[0] = sys.executable
    light = next((p for p in (state_dir() / "command" / key, state_dir() / "command" / job_id) if p.is_file()), None)
    if light is not None:  # a test's light job in place of the image's command (the module's docstring)
        command = ["bash", "-c", light.read_text().strip()]
    hostname = pinned_address(key) or next_address()
    env = {k: rewrite(str(v), mounts) for k, v in job.env.items()}
    env |= {"NODE_ADDR": hostname, "GLOO_SOCKET_IFNAME": "lo"}
    record = {"key": key, "job": job_id, "suffix": suffix, "id": f"job-{uuid.uuid4()}", "status": "pending",
              "hostname": hostname, "image": job.image, "preset": job.preset, "tags": sorted(job.tags),
              "life_span": job.life_span, "schedule_timeout": job.schedule_timeout,
              "command": command, "env": env, "params": params,
              "workdir": rewrite(job.workdir or IMAGE_ROOT, mounts), "log": str(state_dir() / "jobs" / f"{key}.log"),
              "cli": os.environ.get("STANDIN_CLI_NAME", ""), "created_at": time.time()}
    if dry_run:
        click.echo(shlex.join(command))
        return
    write_record(key, record)
    note_event(key, "submitted")
    subprocess.Popen([sys.executable, __file__, "_supervise", key], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     env={**os.environ})
    click.echo(f"Job {record['id']} ({key}) submitted, preset {job.preset}")
    # apolo_cli.job.run_job: `while wait_start and job.status.is_pending: sleep(0.2); status`.
    while late(key) or (read_record(key) or {}).get("status") == "pending":
        time.sleep(0.2)
    started = read_record(key) or {}
    if started.get("status") == "failed":  # "the job has failed to start (most common reason - no resources)"
        click.echo(f"Job {record['id']} ({key}) failed: {started.get('reason', '')}", err=True)
        sys.exit(started.get("exit_code") or EX_PLATFORMERROR)
    if not job.detach:
        _follow(key)
        sys.exit(0 if (read_record(key) or {}).get("status") == "succeeded" else 1)


@cli.command(name="_supervise", hidden=True)
@click.argument("key")
def supervise(key: str) -> None:
    """Run one job: wait out the pending time, start the command, record how it ended."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    record = read_record(key)
    assert record is not None
    stop = {"requested": False}

    def on_term(_signum: int, _frame: Any) -> None:
        stop["requested"] = True

    signal.signal(signal.SIGTERM, on_term)
    pending_s = float(os.environ.get("STANDIN_PENDING_S", "1"))
    schedule_timeout = record.get("schedule_timeout")
    # The platform gives up on a job it cannot schedule in time: after schedule_timeout, a job still pending
    # (its pending time not over, or held) fails.
    limit = float("inf") if schedule_timeout is None else float(schedule_timeout)
    since = time.monotonic()
    while not stop["requested"]:
        waited = time.monotonic() - since
        if waited >= pending_s and not held(key):
            break
        if waited >= limit:
            update_record(key, status="failed", exit_code=EX_PLATFORMERROR,
                          reason=f"not scheduled within the schedule timeout ({schedule_timeout:g} s)")
            return
        time.sleep(0.05)
    if stop["requested"]:
        update_record(key, status="cancelled")
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTQA_", "STANDIN_"))}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    env.update(record["env"])
    with open(record["log"], "ab") as log:
        process = subprocess.Popen(record["command"], cwd=record["workdir"], env=env, stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=subprocess.STDOUT)
    update_record(key, status="running", pid=process.pid)
    while process.poll() is None:
        if stop["requested"]:  # the pod's deletion: SIGTERM to the main process, SIGKILL after the grace period
            update_record(key, status="cancelled")  # at once, as platform-api's cancel_job records it
            process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=float(os.environ.get("STANDIN_GRACE_S", "30")))
            break
        time.sleep(0.1)
    if process.poll() is None:
        _stop_tree(signal.SIGKILL)
    code = process.wait()
    _stop_tree(signal.SIGKILL)  # what the main process left ends with the container (a subreaper has its orphans)
    # The container runtime reports a main process killed by signal N as exit code 128 + N, and Kubernetes gives
    # a container that exited non-zero the reason "Error", which platform-api keeps as the job's reason.
    code = 128 - code if code < 0 else code
    update_record(key, status="succeeded" if code == 0 else "failed", exit_code=code,
                  **({"reason": "Error"} if code and (read_record(key) or {}).get("status") != "cancelled" else {}))


def _descendants() -> list[int]:
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(proc.name))
    found, todo = [], [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _stop_tree(first: signal.Signals) -> None:
    """Send ``first`` to every process of the job, SIGKILL what is left after 5 s."""
    for signum, grace in ((first, 5.0), (signal.SIGKILL, 5.0)):
        pids = _descendants()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                while os.waitpid(-1, os.WNOHANG)[0] > 0:
                    pass
            except ChildProcessError:
                pass
            if not _descendants():
                return
            time.sleep(0.05)


def _find(job_id: str, suffix: str | None) -> dict[str, Any]:
    record = read_record(key_of(job_id, suffix))
    if record is None:
        click.echo(f"Job {job_id} is not running")
        sys.exit(1)
    return record


@cli.command()
@click.argument("job-id")
@click.argument("suffix", required=False)
def status(job_id: str, suffix: str | None) -> None:
    """The rows of `apolo status` that scripts read: Status and Internal Hostname."""
    record = _find(job_id, suffix)
    # JobStatusFormatter: the reason after the status in parentheses; "Exit code" once the job failed or succeeded.
    reason = f" ({record['reason']})" if record.get("reason") else ""
    rows = [("Job", record["id"]), ("Tags", ", ".join(record["tags"])), ("Status", record["status"] + reason),
            ("Image", record["image"]), ("Preset", record["preset"] or "")]
    if record["status"] in ("failed", "succeeded") and record.get("exit_code") is not None:
        rows.append(("Exit code", str(record["exit_code"])))
    if record["status"] in ("running", "succeeded", "failed", "cancelled"):
        rows.append(("Internal Hostname", record["hostname"]))
    for label, value in rows:
        click.echo(f" {label:<25}{value}")


@cli.command()
@click.argument("job-id")
@click.argument("suffix", required=False)
def logs(job_id: str, suffix: str | None) -> None:
    """Print the job's output and follow it until the job ends, like `apolo logs`."""
    _find(job_id, suffix)
    _follow(key_of(job_id, suffix))


def _follow(key: str) -> None:
    path = Path(read_record(key)["log"])  # type: ignore[index]
    position = 0
    while True:
        ended = (read_record(key) or {}).get("status") in TERMINAL
        if path.exists():
            with path.open("rb") as f:
                f.seek(position)
                chunk = f.read()
                position += len(chunk)
            sys.stdout.write(chunk.decode(errors="replace"))
            sys.stdout.flush()
        if ended:
            return
        time.sleep(0.2)


@cli.command()
@click.argument("job-id")
@click.argument("suffix", required=False)
def kill(job_id: str, suffix: str | None) -> None:
    """Kill JOB [SUFFIX], or every job with ALL; returns once it is cancelled (its processes may still be stopping)."""
    if job_id == "ALL":
        records = [r for r in all_records() if r["status"] not in TERMINAL]
    else:
        found = read_record(key_of(job_id, suffix))
        records = [found] if found else []
        if not found:
            click.echo(f"Job {key_of(job_id, suffix)} is not running")
    for record in records:
        if record["status"] in TERMINAL:
            click.echo(f"Job {record['key']} is not running")
            continue
        _kill(record)
        click.echo(f"Killed job {record['key']}")


def _kill(record: dict[str, Any]) -> None:
    supervisors = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _is_supervisor(p, record)]
    for pid in supervisors:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if (read_record(record["key"]) or {}).get("status") in TERMINAL:
            return
        time.sleep(0.1)
    raise click.ClickException(f"job {record['key']} was not cancelled within 30 s")


def _is_supervisor(proc: Path, record: dict[str, Any]) -> bool:
    try:
        cmdline = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if not (b"_supervise" in cmdline and record["key"].encode() in cmdline and
            any(part.endswith(b"platform_cli.py") for part in cmdline)):
        return False
    # This platform's job only: two stand-in platforms (two tests, a test and a bench) may hold jobs of one name.
    try:
        environ = (proc / "environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"STANDIN_PLATFORM_DIR={os.environ['STANDIN_PLATFORM_DIR']}".encode() in environ  # as state_dir() read it


class _Jobs:
    """apolo_sdk.Jobs.list answered from the stand-in's records, with the filters LiveRunner._resolve_jobs passes."""

    async def list(self, *, tags: Any = (), statuses: Any = (), since: Any = None, reverse: bool = False,
                   limit: int | None = None, **_: Any) -> Any:
        from apolo_sdk import JobStatus  # here, as ps's imports: the other subcommands start without them

        def when(stamp: float | None) -> datetime | None:
            return None if stamp is None else datetime.fromtimestamp(stamp, UTC)

        wanted = {JobStatus(s).value for s in statuses}
        found = [r for r in all_records() if set(tags) <= set(r["tags"]) and r["status"] in wanted
                 and (since is None or when(r.get("created_at", time.time())) >= since)]  # platform-api: created since
        found.sort(key=lambda r: r.get("created_at", 0.0), reverse=reverse)
        for record in found[:limit]:
            yield types.SimpleNamespace(
                id=record["id"], status=JobStatus(record["status"]), tags=record["tags"],
                history=types.SimpleNamespace(created_at=when(record.get("created_at")),
                                              started_at=when(record.get("started_at")),
                                              finished_at=when(record.get("finished_at"))))


class _ListingClient(_Client):
    jobs = _Jobs()


@cli.command()
def ps() -> None:
    """List every job of the flow, each suffix of a multi job on a row: apolo_flow.cli.live.ps's own code."""
    # Imported here: apolo_flow's runner and rich cost every other subcommand's start-up nothing.
    from apolo_flow.live_runner import LiveRunner
    from rich.console import Console

    # apolo_flow.cli.main.MainGroup._process_args: the console every command prints to.
    console = Console(highlight=False, log_path=False, log_time_format="[%X %z]",
                      get_datetime=lambda: datetime.now().astimezone())
    options = types.SimpleNamespace(verbosity=0, show_traceback=False)
    runner = LiveRunner(workspace(), console, _ListingClient(), None, options)  # type: ignore[arg-type]

    async def listing() -> None:
        await runner.init_flow()  # LiveRunner.__aenter__ less the project storage, which ps never reads
        try:
            await runner.ps()
        finally:
            await runner.close()

    asyncio.run(listing())


@cli.command()
def mkvolumes() -> None:
    """Create the storage folder of every volume that has a local folder, and only those
    (apolo_flow.live_runner.LiveExecutor.mkvolumes skips volumes without `local`)."""
    for volume in _flow().volumes.values():
        if volume.local is None:
            continue
        storage_path(str(volume.remote)).mkdir(parents=True, exist_ok=True)
        click.echo(f"Created {volume.remote}")


def upload_plan(local: Path) -> dict[str, int]:
    """What `apolo cp --recursive LOCAL storage:...` would send: {path relative to LOCAL: size in bytes}.

    Runs the real traversal, apolo_sdk.Storage.upload_dir (parent folders' ignore files through
    apolo_sdk._storage.load_parent_ignore_files, each folder's own in Storage._upload_dir), with the
    ignore file names `apolo cp` uses by default (apolo_cli.storage.calc_ignore_file_names:
    .apoloignore and .neuroignore); only the storage calls are replaced by a record of the files.
    """
    from apolo_cli.storage import APOLOIGNORE_FILENAME, NEUROIGNORE_FILENAME
    from apolo_sdk._storage import Storage

    sent: dict[str, int] = {}
    root = URL("storage://standin/upload")

    class Recorder(Storage):  # type: ignore[misc]
        def __init__(self) -> None:
            self._file_sem = asyncio.BoundedSemaphore(16)

        def _normalize_uri(self, uri: URL) -> URL:
            return uri

        async def mkdir(self, uri: URL, *, parents: bool = False, exist_ok: bool = False) -> None:
            return None

        async def _upload_file(self, src_path: Path, dst: URL, offset: int, *, progress: Any) -> None:
            sent[dst.path[len(root.path) + 1:]] = src_path.stat().st_size

    recorder = Recorder.__new__(Recorder)
    recorder.__init__()
    asyncio.run(recorder.upload_dir(URL(local.resolve().as_uri()), root,
                                    ignore_file_names=frozenset({APOLOIGNORE_FILENAME, NEUROIGNORE_FILENAME})))
    return sent


def copy_planned(local: Path, target: Path) -> dict[str, int]:
    plan = upload_plan(local)
    for relative in plan:
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local / relative, target / relative)
    return plan


@cli.command()
@click.argument("volume")
def upload(volume: str) -> None:
    """Copy a volume's local folder (ALL: every volume with one) to its storage folder, honouring the
    ignore files as `apolo cp --recursive --update` does (LiveExecutor.upload)."""
    volumes = _flow().volumes
    if volume != "ALL" and volume not in volumes:
        click.echo(f"Unknown volume {volume}; existing volumes: {','.join(sorted(volumes))}", err=True)
        sys.exit(1)
    chosen = [v for v in volumes.values() if v.local is not None] if volume == "ALL" else [volumes[volume]]
    for v in chosen:
        if v.full_local_path is None or not v.full_local_path.is_dir():
            # apolo_sdk.Storage.upload_dir: FileNotFoundError "No such file"; `apolo cp` fails, and with
            # it LiveExecutor.upload_all, before the volumes after this one.
            click.echo(f"ERROR: No such file: {v.full_local_path} (the local folder of volume {v.id})", err=True)
            sys.exit(1)
        target = storage_path(str(v.remote))
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        copy_planned(v.full_local_path, target)
        click.echo(f"Uploaded {v.local} to {v.remote}")


@cli.command()
@click.option("-F", "--force-overwrite", is_flag=True, default=False,
              help="Build even if the destination image already exists.")
@click.argument("image")
def build(force_overwrite: bool, image: str) -> None:
    """Build IMAGE of live.yml: upload its context to storage:.builds/<uuid> (apolo_extras ImageBuilder)
    and record the image; refuse an existing tag without -F (apolo_extras.image._build_image)."""
    flow = _flow()
    if image not in flow.images:
        click.echo(f"Unknown image {image}; existing images: {','.join(sorted(flow.images))}", err=True)
        sys.exit(1)
    ctx = flow.images[image]
    if ctx.context is None or ctx.dockerfile is None:
        click.echo("Image's context or dockerfile part is not set", err=True)
        sys.exit(2)
    record = state_dir() / "images" / (str(ctx.ref).replace("/", "_").replace(":", "_") + ".json")
    if record.exists() and not (force_overwrite or ctx.force_rebuild):
        raise click.ClickException(f"Target image '{ctx.ref}' exists. Use -F/--force-overwrite flag to enforce "
                                   "overwriting.")
    if not isinstance(ctx.context, Path):
        raise click.ClickException(f"the stand-in builds local contexts only, not {ctx.context}")
    context = ctx.context
    upload_to = state_dir() / "storage" / "standin" / ".builds" / str(uuid.uuid4())
    plan = copy_planned(context, upload_to)
    if Path(str(ctx.dockerfile_rel)).as_posix() not in plan:  # kaniko reads --file from the uploaded context
        raise click.ClickException(f"the uploaded build context lacks the Dockerfile {ctx.dockerfile_rel}")
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"ref": str(ctx.ref), "context": str(upload_to), "files": len(plan),
                                  "bytes": sum(plan.values())}))
    click.echo(f"Successfully built {ctx.ref} ({len(plan)} files, {sum(plan.values())} bytes of context)")


if __name__ == "__main__":
    cli()
