"""A stand-in for the platform CLIs (neuro-flow / apolo-flow) that runs jobs as local processes.

The tests put wrappers named ``neuro-flow`` and ``apolo-flow`` that exec this file first on ``PATH``;
``scripts/run_distributed_on_platform.sh`` then drives it exactly as it drives the real CLI.

What is real: each job is rendered from ``.neuro/live.yml`` by neuro-flow's own code
(``apolo_flow.context.RunningLiveFlow``: params with their defaults, env, volumes, the command), the
command line is parsed with the real option syntax (click: ``run JOB --suffix S --param K V``), and
the command is split with ``shlex`` as ``neuro-flow run`` does before handing it to the platform.

What stands in for the platform:

* a job is a local process tree under a supervisor (a child subreaper, so no process of the job
  outlives ``kill``, however it daemonises), in the state directory ``$STANDIN_PLATFORM_DIR``;
* every job gets its own address, a loopback alias 127.0.0.<10+n>, shown as its Internal
  Hostname; the job sees it as ``NODE_ADDR`` (its "pod IP") and ``GLOO_SOCKET_IFNAME=lo``;
* container paths are rewritten to local ones: each volume's mount path to its storage folder
  ``$STANDIN_PLATFORM_DIR/storage/<path of the storage: URI>``, and ``/project`` (the image's copy of
  the repository) to this checkout; ``python`` is the interpreter running this file;
* a job is ``pending`` for ``$STANDIN_PENDING_S`` seconds (default 1) before it starts, then
  ``running``, then ``succeeded``, ``failed`` or ``cancelled``.

Subcommands: run, status, logs, kill (JOB [SUFFIX] or ALL), ps, mkvolumes, upload (VOLUME or ALL).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
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
from pathlib import Path
from typing import Any

import click
from yarl import URL

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGE_ROOT = "/project"
TERMINAL = {"succeeded", "failed", "cancelled"}
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


def _flow() -> Any:
    from apolo_flow.config_loader import LiveLocalCL
    from apolo_flow.context import RunningLiveFlow
    from apolo_flow.parser import ConfigDir

    loader = LiveLocalCL(ConfigDir(REPO_ROOT, REPO_ROOT / ".neuro"), _Client())  # type: ignore[arg-type]
    return asyncio.run(RunningLiveFlow.create(loader, "live"))


def render(job_id: str, suffix: str | None, params: dict[str, str]) -> Any:
    flow = _flow()
    if job_id not in flow.job_ids:
        raise click.ClickException(f"unknown job {job_id!r}; live.yml has {sorted(flow.job_ids)}")

    async def get() -> Any:
        if await flow.is_multi(job_id):
            if suffix is None:
                raise click.ClickException(f"{job_id} is a multi-job: pass --suffix")
            return await flow.get_multi_job(job_id, suffix, None, params)
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
    table = {**{m: str(p) for m, p in mounts.items()}, IMAGE_ROOT: str(REPO_ROOT)}
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
    write_record(key, {**record, **changes})


def all_records() -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((state_dir() / "jobs").glob("*.json"))]


def next_address() -> str:
    used = {r["hostname"] for r in all_records()}
    for n in range(10, 250):
        if f"127.0.0.{n}" not in used:
            return f"127.0.0.{n}"
    raise click.ClickException("the stand-in ran out of loopback addresses")


# --- the CLI ---------------------------------------------------------------------------------

@click.group()
def cli() -> None:
    """Stand-in for neuro-flow / apolo-flow: runs live.yml jobs as local processes (tests only)."""


@cli.command()
@click.option("-s", "--suffix")
@click.option("-p", "--param", type=(str, str), multiple=True)
@click.option("--dry-run", is_flag=True, default=False)
@click.argument("job-id")
@click.argument("args", nargs=-1)
def run(job_id: str, suffix: str | None, param: list[tuple[str, str]], dry_run: bool, args: tuple[str, ...]) -> None:
    params = dict(param)
    job = render(job_id, suffix, params)
    key = key_of(job_id, suffix)
    existing = read_record(key)
    if existing and existing["status"] not in TERMINAL:
        raise click.ClickException(f"job {key} is already {existing['status']}")
    mounts = mounts_of(job.volumes)
    command = [rewrite(arg, mounts) for arg in shlex.split(job.cmd or "")]
    if command and command[0] in ("python", "python3"):
        command[0] = sys.executable
    hostname = next_address()
    env = {k: rewrite(str(v), mounts) for k, v in job.env.items()}
    env |= {"NODE_ADDR": hostname, "GLOO_SOCKET_IFNAME": "lo"}
    record = {"key": key, "job": job_id, "suffix": suffix, "id": f"job-{uuid.uuid4()}", "status": "pending",
              "hostname": hostname, "image": job.image, "preset": job.preset, "tags": sorted(job.tags),
              "life_span": job.life_span, "command": command, "env": env, "params": params,
              "workdir": rewrite(job.workdir or IMAGE_ROOT, mounts), "log": str(state_dir() / "jobs" / f"{key}.log"),
              "cli": os.environ.get("STANDIN_CLI_NAME", "")}
    if dry_run:
        click.echo(shlex.join(command))
        return
    write_record(key, record)
    subprocess.Popen([sys.executable, __file__, "_supervise", key], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     env={**os.environ})
    click.echo(f"Job {record['id']} ({key}) submitted, preset {job.preset}")
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
    deadline = time.monotonic() + float(os.environ.get("STANDIN_PENDING_S", "1"))
    while time.monotonic() < deadline and not stop["requested"]:
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
        if stop["requested"]:
            _stop_tree()
            update_record(key, status="cancelled")
            break
        time.sleep(0.1)
    code = process.wait()
    _stop_tree()  # anything the job left behind (orphans were reparented to this subreaper)
    update_record(key, status="succeeded" if code == 0 else "failed", exit_code=code)


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


def _stop_tree() -> None:
    """SIGTERM every process of the job, SIGKILL what is left after 5 s (as a container stop does)."""
    for signum, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
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
    rows = [("Job", record["id"]), ("Tags", ", ".join(record["tags"])), ("Status", record["status"]),
            ("Image", record["image"]), ("Preset", record["preset"] or "")]
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
    """Kill JOB [SUFFIX], or every job with ALL; waits until the job has stopped."""
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
    raise click.ClickException(f"job {record['key']} did not stop within 30 s")


def _is_supervisor(proc: Path, record: dict[str, Any]) -> bool:
    try:
        cmdline = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"_supervise" in cmdline and record["key"].encode() in cmdline and \
        any(part.endswith(b"platform_cli.py") for part in cmdline)


@cli.command()
def ps() -> None:
    for record in all_records():
        click.echo(f" {record['key']:<45}{record['status']:<12}{record['id']}")


@cli.command()
def mkvolumes() -> None:
    for volume in _flow().volumes.values():
        storage_path(str(volume.remote)).mkdir(parents=True, exist_ok=True)
        click.echo(f"Created {volume.remote}")


@cli.command()
@click.argument("volume")
def upload(volume: str) -> None:
    """Copy a volume's local folder (ALL: every volume with one) to its storage folder."""
    volumes = _flow().volumes
    chosen = [v for v in volumes.values() if v.local is not None] if volume == "ALL" else [volumes[volume]]
    for v in chosen:
        if v.full_local_path is None or not v.full_local_path.is_dir():
            click.echo(f"Skipped {v.id}: no local folder {v.local}")
            continue
        target = storage_path(str(v.remote))
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(v.full_local_path, target, ignore=shutil.ignore_patterns("__pycache__"))
        click.echo(f"Uploaded {v.local} to {v.remote}")


if __name__ == "__main__":
    cli()
