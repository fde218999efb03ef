"""The platform recipe read against the real CLI's own code (no platform, no processes started):
every documented command exists in the installed click trees, a build uploads only what the
Dockerfile copies, job names pass the platform's rule, the launcher reads --life-span as neuro-flow
does, and the Dockerfile starts from a published PyTorch image."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from distqa.launch.platform.cli import main as launcher_main

from support.processes import clean_env
from support.repo import IN_A_FORK, REPO_ROOT

STANDIN_DIR = REPO_ROOT / "tests" / "standin"
LAUNCH = REPO_ROOT / "scripts" / "run_distributed_on_platform.sh"
sys.path.insert(0, str(STANDIN_DIR))
import platform_cli  # noqa: E402  (tests/standin is not a package)
from cli_commands import check_command_line, click_trees, documented_command_lines  # noqa: E402

# --- 6. every documented command line exists in the installed CLI ------------------------------

def test_every_documented_command_exists_in_the_installed_cli_with_its_options() -> None:
    from apolo_flow.parser import parse_live

    live = parse_live(REPO_ROOT, REPO_ROOT / ".neuro" / "live.yml")
    trees = click_trees()
    lines = documented_command_lines()
    commands = {line.split()[1] for _, line in lines}
    assert {"build", "mkvolumes", "upload", "run", "logs", "login"} <= commands, \
        "the extractor finds the commands of README.md and docs/"
    wrong = [f"{name}: {line}\n    {problem}" for name, line in lines
             if (problem := check_command_line(line, trees, live))]
    assert not wrong, "\n".join(wrong)


def test_every_documented_command_exists_in_apolo_flow_26_too() -> None:
    result = subprocess.run([str(flow26()), str(STANDIN_DIR / "cli_commands.py")], cwd=REPO_ROOT, env=clean_env(),
                            capture_output=True, text=True, timeout=120)
    report = json.loads(result.stdout or "{}")
    assert result.returncode == 0 and report["lines"] > 20, result.stdout + result.stderr


def test_the_checker_refuses_commands_and_options_the_cli_lacks() -> None:
    from apolo_flow.parser import parse_live

    live = parse_live(REPO_ROOT, REPO_ROOT / ".neuro" / "live.yml")
    trees = click_trees()
    assert "is not a command" in check_command_line("neuro-flow exec remote_debug bash", trees, live)
    assert "is not a command" in check_command_line("neuro-flow port-forward remote_debug 5678:5678", trees, live)
    assert "has no option --tag" in check_command_line("neuro-flow build --tag x myimage", trees, live)
    assert "does not define" in check_command_line("neuro-flow run nosuchjob", trees, live)
    assert check_command_line("apolo exec distqa-remote-debug -- bash", trees, live) is None
    assert check_command_line("neuro-flow build -F myimage", trees, live) is None
    assert check_command_line('neuro-flow run train --param args "--max-steps 5"', trees, live) is None


# --- 2. a build uploads only what the Dockerfile copies ----------------------------------------

def dockerfile_sources() -> list[str]:
    """The local paths of the Dockerfile's COPY instructions."""
    sources = []
    for line in (REPO_ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            sources += line.split()[1:-1]
    return sources


def test_a_build_uploads_only_what_the_dockerfile_copies(tmp_path: Path) -> None:
    """`neuro-flow build myimage` copies the context with `apolo cp --recursive`: its ignore-file logic
    (apolo_sdk) decides what goes. A checkout with a 100 MB NQ file, a .venv, .git, .env and results
    must upload a few hundred kB, the Dockerfile and all it copies included; `upload data` still
    sends the NQ file."""
    checkout = tmp_path / "checkout"
    tracked = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files", "-z"], capture_output=True, check=True)
    for relative in [*tracked.stdout.decode().split("\0"), ".neuroignore"]:
        source = REPO_ROOT / relative
        if relative and source.is_file():
            (checkout / relative).parent.mkdir(parents=True, exist_ok=True)
            (checkout / relative).write_bytes(source.read_bytes())
    for big in ("data/nq/simplified-nq-train.jsonl", "data/simplified-nq-train.jsonl", ".venv/lib/torch.so",
                "results/run/checkpoints/step-1.pt", "build/lib/x.bin", ".git/objects/pack/p.pack"):
        (checkout / big).parent.mkdir(parents=True, exist_ok=True)
        with open(checkout / big, "wb") as f:
            f.truncate(100 * 2**20)  # sparse: 100 MB of size, no disk
    (checkout / ".env").write_text("KAGGLE_KEY=secret\n")
    (checkout / "src" / "distqa" / "__pycache__").mkdir()
    (checkout / "src" / "distqa" / "__pycache__" / "x.pyc").write_bytes(b"0" * 1000)

    sent = platform_cli.upload_plan(checkout)
    total = sum(sent.values())
    assert total < 2 * 2**20, f"a build uploads {total / 2**20:.1f} MB: {sorted(sent, key=sent.get)[-5:]}"
    for source in [*dockerfile_sources(), "Dockerfile"]:
        assert any(p == source or p.startswith(source.rstrip("/") + "/") for p in sent), f"{source} is not uploaded"
    assert not [p for p in sent if p.startswith((".env", ".venv/", ".git/", "data/nq", "results/", "build/"))
                or "__pycache__" in p]
    assert not [p for p in sent if p.startswith("data/") and not p.startswith("data/tiny-bert/")]

    if not IN_A_FORK:  # the template's data volume (a fork's .neuro/project.yml names its own)
        data = platform_cli.upload_plan(checkout / "data" / "nq")  # what `neuro-flow upload data` sends
        assert data == {"README.md": (REPO_ROOT / "data" / "nq" / "README.md").stat().st_size,
                        "simplified-nq-train.jsonl": 100 * 2**20}
    src = platform_cli.upload_plan(checkout / "src")  # `upload code`: the package, no byte code
    assert "distqa/train.py" in src and not [p for p in src if "__pycache__" in p]
    assert platform_cli.upload_plan(checkout / "results") == {}, "local checkpoints never go up"


def test_every_volume_uploads_from_a_fresh_clone_and_data_is_where_the_download_puts_it() -> None:
    """`neuro-flow upload ALL` fails at the first volume whose local folder is missing (apolo cp), so
    each one must exist in a clone; the data volume is the folder scripts/download_nq.sh fills."""
    from apolo_flow.parser import parse_project_stream

    with (REPO_ROOT / ".neuro" / "project.yml").open() as project_yml:  # the volumes are the project's own
        project = parse_project_stream(project_yml)
    tracked = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files"], capture_output=True, text=True,
                             check=True).stdout.splitlines()
    for volume in project.volumes.values():
        local = volume.local.pattern if volume.local is not None else None
        if local is not None:
            assert any(path.startswith(local.rstrip("/") + "/") for path in tracked), f"{local} is not in a clone"
    if not IN_A_FORK:  # the template's data volume (a fork's .neuro/project.yml names its own)
        assert "local: data/nq" in (REPO_ROOT / ".neuro" / "project.yml").read_text()
        assert 'dir="$repo_root/data/nq"' in (REPO_ROOT / "scripts" / "download_nq.sh").read_text()


# --- 5. job names --------------------------------------------------------------------------------

def dry_run(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """The launcher's dry run in this process (python -m distqa.launch.platform, which the script execs)."""
    code = launcher_main(["--dry-run", *args], clean_env())
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, captured.out, captured.err)


@pytest.mark.parametrize("nodes", [2, 11, 101])
def test_the_launcher_accepts_a_run_id_exactly_when_every_nodes_job_name_is_valid(
        capsys: pytest.CaptureFixture[str], nodes: int) -> None:
    from apolo_cli.click_types import JOB_NAME

    def valid(name: str) -> bool:
        try:
            JOB_NAME.convert(name, None, None)
            return True
        except ValueError:
            return False

    for length in range(12, 19):
        run_id = ("dq-" + "a1b2c3d4e5f6g7h8")[:length]
        names = [platform_cli.job_name("distqa", "distributed_training", f"{run_id}-{rank}") for rank in range(nodes)]
        result = dry_run(capsys, "--nodes", str(nodes), "--run-id", run_id)
        assert (result.returncode == 0) == all(valid(n) for n in names), (run_id, result.stderr)
        if result.returncode != 0:
            assert result.returncode == 2 and "is not a valid platform job name" in result.stderr
            assert f"node {nodes - 1}'s job name" in result.stderr and "use a --run-id of at most" in result.stderr


def test_the_standin_refuses_a_job_name_the_platform_refuses(tmp_path: Path) -> None:
    env = clean_env(STANDIN_PLATFORM_DIR=str(tmp_path))
    long = subprocess.run([sys.executable, str(STANDIN_DIR / "platform_cli.py"), "run", "distributed_training",
                           "--suffix", "dq-1122-1153000-10", "--param", "node_rank", "10"],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert long.returncode == 2 and "Invalid job name" in long.stderr
    assert not list((tmp_path / "jobs").glob("*.json")), "nothing starts"


# --- 9. --life-span as neuro-flow reads it -------------------------------------------------------

def test_the_launcher_accepts_exactly_the_life_spans_neuro_flow_accepts(capsys: pytest.CaptureFixture[str]) -> None:
    """neuro-flow converts a job's life_span with apolo_flow.expr.OptTimeDeltaExpr and passes
    `--life-span=<int seconds>s` to `apolo run`."""
    from apolo_flow.expr import OptTimeDeltaExpr

    def flow_accepts(value: str) -> bool:
        try:
            seconds = OptTimeDeltaExpr.convert(OptTimeDeltaExpr.__new__(OptTimeDeltaExpr), value)
            return value != "" and int(seconds) >= 0
        except (ValueError, OverflowError):
            return False

    samples = ["1d", "6h", "1d12h", "90m", "45s", "1d2h3m4s", "3600", "1.5", "0", "1h1d", "1d1d", "1w", "6 h",
               "1D", "h", "-5", "2h30", "12h0m", "100000", "1e3", "+60", ".5", "7.", "inf", "nan", "1e400", "d"]
    for value in samples:
        result = dry_run(capsys, "--run-id", "ls", "--life-span", value)
        assert (result.returncode == 0) == flow_accepts(value), (value, result.stderr)
        if result.returncode:
            assert "--life-span must be" in result.stderr


def test_the_launcher_works_from_any_directory_and_its_help_is_the_documented_text(tmp_path: Path) -> None:
    """The script (a shim: it finds a Python and execs python -m distqa.launch.platform) from another directory;
    its --help prints the options, the environment and the exit statuses (the launcher's docstring); a PYTHON
    without python-dotenv is refused in one line."""
    from distqa.launch.platform import options

    result = subprocess.run(["bash", str(LAUNCH), "--dry-run", "--run-id", "anywhere"], cwd=tmp_path,
                            env=clean_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(" run distributed_training --suffix anywhere-") == 2, result.stdout
    shown = subprocess.run(["bash", str(LAUNCH), "--help"], cwd=tmp_path, env=clean_env(), capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0 and shown.stdout == options.__doc__, shown.stderr
    for part in ("Usage:", "Options:", "--max-resubmits K", "--external-store", "Environment: FLOW_CLI",
                 "ENV_FILE", "Exit status: 0 when every node succeeded", "130 after Ctrl-C or SIGTERM"):
        assert part in shown.stdout, part
    python = tmp_path / "python"  # an interpreter without python-dotenv (PYTHON picks the launcher's interpreter)
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(0o755)
    refused = subprocess.run(["bash", str(LAUNCH), "--dry-run"], cwd=tmp_path, env=clean_env(PYTHON=str(python)),
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and refused.stdout == "" and refused.stderr.count("\n") == 1, refused.stderr
    assert f"{python} cannot import dotenv (python-dotenv): run 'make setup'" in refused.stderr


# --- 10. neuro-flow 24.12 and its successor apolo-flow 26.7 -------------------------------------

FLOW26_PYTHON = REPO_ROOT / ".venv-apolo-flow26" / "bin" / "python"
RENDER_ALL = """
import asyncio, json, sys
sys.path.insert(0, sys.argv[1])
import platform_cli
flow = platform_cli._flow()
jobs = {}
for job_id in flow.job_ids:
    multi = asyncio.run(flow.is_multi(job_id))
    params = {"node_rank": "1", "master_addr": "m", "schedule_timeout": "120", "args": "--lr '1e-3'",
              "external_store": "true"} if job_id == "distributed_training" else {}
    if job_id == "rendezvous_store":  # the other multi job: one run's store
        params = {"port": "29555", "schedule_timeout": "120"}
    job = platform_cli.render(job_id, "r-1" if multi else None, params)
    jobs[job_id] = {"cmd": job.cmd, "volumes": sorted(job.volumes), "env": dict(job.env), "image": job.image,
                    "life_span": job.life_span, "schedule_timeout": job.schedule_timeout, "tags": sorted(job.tags),
                    "preset": job.preset, "detach": job.detach}
print(json.dumps({"jobs": jobs}, sort_keys=True))
"""


def flow26() -> Path:
    assert FLOW26_PYTHON.exists(), ("apolo-flow 26 is not installed: `make setup` puts it into .venv-apolo-flow26 "
                                    "(requirements-apolo-flow.txt)")
    return FLOW26_PYTHON


def render_all(python: Path | str) -> dict:
    result = subprocess.run([str(python), "-c", RENDER_ALL, str(STANDIN_DIR)], cwd=REPO_ROOT, env=clean_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_live_yml_and_the_standin_render_every_job_alike_under_neuro_flow_24_and_apolo_flow_26() -> None:
    """apolo-flow 26.7 changed get_multi_job (no args) and dropped multi.args; live.yml uses neither,
    so every job renders the same, and the stand-in runs under both."""
    old, new = render_all(sys.executable), render_all(flow26())
    assert version_of(sys.executable, "neuro-flow").startswith("24.12.")
    assert version_of(flow26(), "apolo-flow").startswith("26.7.")
    assert old["jobs"] == new["jobs"]
    training = new["jobs"]["distributed_training"]
    assert training["schedule_timeout"] == 120 and shlex.split(training["cmd"])[-3:] == ["--", "--lr", "1e-3"]
    assert "--external-store" in shlex.split(training["cmd"])  # live.yml's conditional, evaluated by both
    store = new["jobs"]["rendezvous_store"]
    assert shlex.split(store["cmd"]) == ["python", "-m", "distqa.launch.rendezvous_store", "--port", "29555"]
    assert store["schedule_timeout"] == 120 and store["detach"]


def version_of(python: Path | str, distribution: str) -> str:
    code = f"from importlib.metadata import version; print(version({distribution!r}))"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60,
                          check=True).stdout.strip()


def test_the_launcher_drives_apolo_flow_26_like_neuro_flow_24(tmp_path: Path) -> None:
    """The launcher against the stand-in running on apolo-flow 26.7: job names are checked, `run` waits
    while pending and a master the platform cannot place fails after --timeout."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apolo-flow").write_text(f"#!/bin/sh\nexec {shlex.quote(str(flow26()))} "
                                        f"{shlex.quote(str(STANDIN_DIR / 'platform_cli.py'))} \"$@\"\n")
    (bin_dir / "apolo-flow").chmod(0o755)
    env = clean_env(PATH=f"{bin_dir}:{os.environ['PATH']}", STANDIN_PLATFORM_DIR=str(tmp_path / "platform"),
                    STANDIN_PENDING_S="600", FLOW_CLI="apolo-flow")
    result = subprocess.run(["bash", str(LAUNCH), "--nodes", "2", "--run-id", "v26", "--timeout", "2", "--poll", "0.5"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the master job (distributed_training v26-0) was not started within 2 s" in result.stderr
    record = json.loads((tmp_path / "platform" / "jobs" / "distributed_training-v26-0.json").read_text())
    assert (record["status"], record["schedule_timeout"], record["cli"]) == ("failed", 2, "")


# --- 3. storage the job cannot write stops it at start ---------------------------------------------

@pytest.mark.parametrize("script", [["scripts/worker.sh", "--dry-run", "--nproc-per-node", "1"],
                                    ["scripts/in_job.sh", "true"]])
def test_a_job_that_cannot_write_its_storage_stops_at_start_naming_the_folder(
        unwritable_mount: tuple[Path, list[str]], script: list[str]) -> None:
    mount, prefix = unwritable_mount
    env = clean_env(DISTQA_OUTPUT_DIR=str(mount), HF_HOME=str(mount.parent / "cache"), PYTHON=sys.executable)
    result = subprocess.run([*prefix, "bash", str(REPO_ROOT / script[0]), *script[1:]], cwd="/", env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert f"cannot write to {mount} ({mount} is owned by uid {mount.stat().st_uid}, mode" in line
    assert f"this job runs as uid {os.geteuid() if not prefix else 1000}" in line and "Fix:" in line


@pytest.mark.skipif(os.geteuid() != 0, reason="the image runs as root; only root writes a root-owned 755 mount")
def test_the_image_user_root_writes_a_root_owned_mount(unwritable_mount: tuple[Path, list[str]]) -> None:
    mount, _ = unwritable_mount
    cache = mount.parent / "cache" / "huggingface"
    env = clean_env(DISTQA_OUTPUT_DIR=str(mount), HF_HOME=str(cache), PYTHON=sys.executable)
    result = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "in_job.sh"), "true"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert cache.is_dir() and not list(mount.iterdir()), "created the missing cache folder, left no probe"
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", dockerfile, re.M)
    assert users in ([], ["root"], ["0"]), f"the image must run as root on the platform, not as {users[-1]}"


# --- 1. the base image ---------------------------------------------------------------------------

# The pytorch/pytorch tags published for torch 2.13.0 (Docker Hub and ghcr.io/pytorch/pytorch): public
# Dockerfiles pull pytorch/pytorch:2.13.0-cuda12.6-cudnn9-runtime (one pins its digest
# sha256:6acf597eeb8e...), 2.13.0-cuda13.0-cudnn9-runtime and 2.13.0-cuda13.2-cudnn9-runtime/-devel;
# no public file names a cuda12.8 build of 2.13.0.
PUBLISHED_TORCH_IMAGES = {"2.13.0": {"cuda12.6", "cuda13.0", "cuda13.2"}}


def test_the_dockerfile_starts_from_a_published_pytorch_image_with_the_pinned_torch() -> None:
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", dockerfile, re.M)
    assert base, "the Dockerfile names its base in ARG BASE_IMAGE"
    match = re.fullmatch(r"pytorch/pytorch:(?P<torch>[\d.]+)-(?P<cuda>cuda[\d.]+)-cudnn\d+-runtime", base.group(1))
    assert match, f"{base.group(1)} is not an official pytorch/pytorch runtime tag"
    torch_pin = re.search(r"^torch==(\S+)$", (REPO_ROOT / "requirements.txt").read_text(), re.M)
    assert torch_pin and match["torch"] == torch_pin.group(1), "the base must carry the torch of requirements.txt"
    assert match["cuda"] in PUBLISHED_TORCH_IMAGES.get(match["torch"], set()), f"{base.group(1)} is not published"
    assert re.search(r"NVIDIA driver", dockerfile), "the Dockerfile says which NVIDIA driver the image needs"


def test_the_platform_cli_check_reads_the_platform_page() -> None:
    """tests/launchers/test_platform_cli.py checks the neuro-flow/apolo lines of every document; the platform's
    commands moved from the README to docs/PLATFORM.md, so that page must be among what it reads."""
    lines = [line for name, line in documented_command_lines() if name == "docs/PLATFORM.md"]
    commands_found = {line.split()[1] for line in lines}
    assert {"build", "mkvolumes", "upload", "run", "logs", "kill"} <= commands_found, lines
