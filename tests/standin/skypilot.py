"""SkyPilot 0.14.1's own code, run offline inside .venv-skypilot (requirements-skypilot.txt) for
tests/launchers/test_skypilot.py: its task loader, and the script and environment each node of a task gets.

    python tests/standin/skypilot.py load TASK.yaml... [--env K=V]...     # JSON: each task, or SkyPilot's error
    python tests/standin/skypilot.py nodes TASK.yaml --ips A,B [--env K=V]... --out DIR

``load`` is what ``sky launch TASK.yaml --env K=V`` does first (sky/client/cli/command.py, ~line 1046:
``dag_utils.load_chain_dag_from_yaml(entrypoint, env_overrides=env)``): the task and resources schemas, the storage
(file_mounts) schema, the envs' rules. ``nodes`` builds the job program SkyPilot's own generator (RayCodeGen) writes
for the task, runs its per-node launch statements with Ray's answers given (the node addresses, which node is which),
and writes ``node-<rank>.sh``, the script each node runs, and ``job-program.py``. Set HOME for it: importing ``sky``
creates ~/.sky.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from pathlib import Path
from typing import Any

from sky import exceptions
from sky import task as task_lib
from sky.backends import backend_utils, task_codegen
from sky.skylet import constants, log_lib
from sky.utils import common_utils, dag_utils


def load_task(path: str, envs: list[tuple[str, str]]) -> task_lib.Task:
    """The task of ``path`` as ``sky launch path --env K=V`` loads it (dag_utils.load_chain_dag_from_yaml)."""
    dag = dag_utils.load_chain_dag_from_yaml(path, env_overrides=envs)
    if len(dag.tasks) != 1:
        raise ValueError(f"{path}: {len(dag.tasks)} tasks; the recipe is one task")
    return dag.tasks[0]


def summary(task: task_lib.Task) -> dict[str, Any]:
    """What the tests read of a loaded task."""
    resources = list(task.resources)
    return {
        "num_nodes": task.num_nodes,
        "envs": dict(task.envs),
        "secrets": sorted(task.secrets),
        "accelerators": [r.accelerators for r in resources],
        "images": [r.extract_docker_image() for r in resources],
        "workdir": task.workdir,
        "mounts": {path: {"bucket": store.name, "mode": store.mode.value}
                   for path, store in task.storage_mounts.items()},
        "run": task.run,
    }


def task_env_vars(task: task_lib.Task, job_id: int, cluster_name: str) -> dict[str, str]:
    """The variables the backend hands the job program for a task, following CloudVmRayBackend._get_task_env_vars
    (sky/backends/cloud_vm_ray_backend.py, line 7030 in 0.14.1; it needs a cluster handle, so it is followed here):
    the task's envs and secrets in plain text, SKYPILOT_TASK_ID (common_utils.get_global_job_id) and
    _skypilot_predefined_env_vars (line 7010): SKYPILOT_CLUSTER_INFO and SKYPILOT_USER."""
    env = task_lib.get_plaintext_envs_and_secrets(task.envs_and_secrets)
    env.setdefault(constants.TASK_ID_ENV_VAR,
                   common_utils.get_global_job_id("sky-test", cluster_name=cluster_name, job_id=str(job_id)))
    env["SKYPILOT_CLUSTER_INFO"] = json.dumps({"cluster_name": cluster_name, "cloud": "Local", "region": None,
                                               "zone": None})
    env[constants.USER_ENV_VAR] = common_utils.get_current_user_name()
    return env


def job_program(task: task_lib.Task, ips: list[str], job_id: int, env: dict[str, str]) -> str:
    """The Python program SkyPilot runs on the head node for a task of len(ips) nodes, built by its own generator
    as CloudVmRayBackend._execute_task_n_nodes builds it (cloud_vm_ray_backend.py, line 7138): RayCodeGen's
    prologue, setup, one task per node, epilogue (sky/backends/task_codegen.py)."""
    codegen = task_codegen.RayCodeGen()
    codegen.add_prologue(job_id)
    codegen.add_setup(len(ips), backend_utils.get_task_demands_dict(task), stable_cluster_internal_ips=ips,
                      env_vars=env, log_dir="~/sky_logs/tasks", setup_cmd=None)
    codegen.add_task(len(ips), bash_script=task.run, env_vars=env, task_name=task.name,
                     resources_dict=backend_utils.get_task_demands_dict(task), log_dir="~/sky_logs/tasks")
    codegen.add_epilogue()
    return codegen.build()


class _Anything:
    """Ray's names in the launch statements (the placement group's scheduling strategy): any attribute, any call."""

    def __getattr__(self, name: str) -> _Anything:
        return self

    def __call__(self, *args: object, **kwargs: object) -> _Anything:
        return self


class _Launches:
    """The program's ``run_bash_command_with_log_and_return_pid.options(...).remote(script, log_path,
    env_vars=...)``: each node's launch, recorded instead of sent to Ray."""

    def __init__(self) -> None:
        self.nodes: list[tuple[str, dict[str, str]]] = []

    def options(self, **_: object) -> _Launches:
        return self

    def remote(self, script: str, log_path: str, env_vars: dict[str, object], **_: object) -> int:
        self.nodes.append((script, {name: str(value) for name, value in env_vars.items()}))
        return len(self.nodes) - 1


def node_launches(program: str, ips: list[str]) -> list[tuple[str, dict[str, str]]]:
    """Each node's (script, variables) as the job program launches them: its statements from the first
    ``sky_env_vars_dict = {}`` to the wait for the nodes (``get_or_fail``) run here, with Ray's answers given:
    the nodes' addresses in rank order and each placement bundle's node. SkyPilot derives the ranks from the
    addresses (add_setup: ``job_ip_rank_map``); emulated nodes share one address, so the ranks are given by node."""
    body = ast.parse(program).body
    start = next(i for i, node in enumerate(body) if isinstance(node, ast.Assign)
                 and ast.unparse(node) == "sky_env_vars_dict = {}")
    end = next(i for i, node in enumerate(body) if i > start and "get_or_fail(futures" in ast.unparse(node))
    nodes = [f"node-{rank}" for rank in range(len(ips))]  # one key per emulated node (they share an address)
    launches = _Launches()
    namespace: dict[str, Any] = {
        "os": os, "ray": _Anything(), "pg": None, "futures": [], "run_bash_command_with_log_and_return_pid": launches,
        "gang_scheduling_id_to_ip": nodes, "job_ip_rank_list": nodes,
        "job_ip_rank_map": {node: rank for rank, node in enumerate(nodes)},
        "cluster_ips_to_node_id": {node: rank for rank, node in enumerate(nodes)}, "job_ip_list_str": "\n".join(ips),
    }
    exec(compile(ast.Module(body=body[start:end], type_ignores=[]), "<SkyPilot's job program>", "exec"), namespace)
    return launches.nodes


def node_script(script: str, env: dict[str, str]) -> str:
    """The file a node runs with ``/bin/bash -i`` (log_lib.run_bash_command_with_log, log_lib.py line 416, which the
    job program runs on each node): log_lib.make_task_bash_script around the launched script: ~/.bashrc,
    ``cd ~/sky_workdir``, ``export`` of every variable."""
    return log_lib.make_task_bash_script(script, env_vars=env)


def _pairs(values: list[str]) -> list[tuple[str, str]]:
    return [tuple(value.split("=", 1)) for value in values]  # type: ignore[misc]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    load = commands.add_parser("load")
    load.add_argument("tasks", nargs="+")
    nodes = commands.add_parser("nodes")
    nodes.add_argument("task")
    nodes.add_argument("--ips", required=True, help="the nodes' addresses in rank order, comma-separated")
    nodes.add_argument("--job-id", type=int, default=1)
    nodes.add_argument("--out", type=Path, required=True)
    for command in (load, nodes):
        command.add_argument("--env", action="append", default=[], help="K=V, as sky launch --env")
    options = parser.parse_args(argv)
    if options.command == "load":
        results = []
        for path in options.tasks:
            try:
                results.append({"path": path, "task": summary(load_task(path, _pairs(options.env)))})
            except (exceptions.InvalidSkyPilotConfigError, ValueError) as error:
                results.append({"path": path, "error": str(error)})
        print(json.dumps(results))
        return 0
    task = load_task(options.task, _pairs(options.env))
    ips = options.ips.split(",")
    program = job_program(task, ips, options.job_id, task_env_vars(task, options.job_id, "distqa"))
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "job-program.py").write_text(program)
    environments = {}
    for rank, (script, env) in enumerate(node_launches(program, ips)):
        (options.out / f"node-{rank}.sh").write_text(node_script(script, env))
        environments[rank] = env
    print(json.dumps(environments))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
