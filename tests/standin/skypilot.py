"""SkyPilot 0.14.1's own code, run offline inside .venv-skypilot (requirements-skypilot.txt) for
tests/test_skypilot.py: its task loader, and the script and environment each node of a task gets.

    python tests/standin/skypilot.py load TASK.yaml... [--env K=V]...     # JSON: each task, or SkyPilot's error
    python tests/standin/skypilot.py nodes TASK.yaml --ips A,B [--gpus N] [--env K=V]... --out DIR

``load`` is what ``sky launch TASK.yaml --env K=V`` does first (sky/client/cli/command.py, ~line 1046:
``dag_utils.load_chain_dag_from_yaml(entrypoint, env_overrides=env)``): the task and resources schemas, the storage
(file_mounts) schema, the envs' rules. ``nodes`` writes ``node-<rank>.sh`` per node, the script SkyPilot runs on it,
built by SkyPilot's own functions; only the values known only on a cluster (node addresses, job id) come from the
test. Set HOME for it: importing ``sky`` creates ~/.sky.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from sky import exceptions
from sky import task as task_lib
from sky.backends import backend_utils, task_codegen
from sky.skylet import constants, log_lib
from sky.utils import accelerator_registry, common_utils, dag_utils


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


def gpus_per_node(task: task_lib.Task) -> int:
    """SKYPILOT_NUM_GPUS_PER_NODE of a task's nodes, as RayCodeGen._add_ray_task computes it
    (sky/backends/task_codegen.py, lines 612-621 and 654 in 0.14.1): the task's demands
    (backend_utils.get_task_demands_dict, backend_utils.py:4318), their one accelerator's count unless it is a
    schedulable non-GPU accelerator (TPUs), rounded up (a fractional GPU gives 1); 0 without accelerators."""
    demands = backend_utils.get_task_demands_dict(task)
    name, count = task_codegen.TaskCodeGen()._get_accelerator_details(demands)
    num_gpus = 0.0
    if name is not None and not accelerator_registry.is_schedulable_non_gpu_accelerator(name):
        num_gpus = count
    return math.ceil(num_gpus)


def node_environment(task: task_lib.Task, ips: list[str], rank: int, job_id: int, gpus: int | None = None,
                     cluster_name: str = "distqa") -> dict[str, str]:
    """The variables SkyPilot 0.14.1 exports on node ``rank`` of a task's ``run:``, in its order.

    - RayCodeGen._add_ray_task (sky/backends/task_codegen.py, lines 628-672): SKYPILOT_NODE_IPS (the job's node
      addresses joined by newlines, in rank order: ``job_ip_list_str`` of add_setup, line 572), SKYPILOT_NUM_NODES,
      then the task's variables, then SKYPILOT_NUM_GPUS_PER_NODE (:func:`gpus_per_node`), SKYPILOT_NODE_RANK and
      SKYPILOT_INTERNAL_JOB_ID;
    - the task's variables: CloudVmRayBackend._get_task_env_vars (sky/backends/cloud_vm_ray_backend.py, line 7030):
      its envs and secrets in plain text (task_lib.get_plaintext_envs_and_secrets), SKYPILOT_TASK_ID
      (common_utils.get_global_job_id) and _skypilot_predefined_env_vars (line 7010): SKYPILOT_CLUSTER_INFO and
      SKYPILOT_USER;
    - names from sky/skylet/constants.py (lines 641-646); values as log_lib.make_task_bash_script exports them
      (``str(v)``, log_lib.py line 391).

    ``gpus`` replaces the computed GPU count: the emulated nodes have none, whatever the task asks for."""
    env: dict[str, Any] = {constants.SKYPILOT_NODE_IPS: "\n".join(ips), constants.SKYPILOT_NUM_NODES: len(ips)}
    task_env = task_lib.get_plaintext_envs_and_secrets(task.envs_and_secrets)
    task_env.setdefault(constants.TASK_ID_ENV_VAR,
                        common_utils.get_global_job_id("sky-test", cluster_name=cluster_name, job_id=str(job_id)))
    task_env["SKYPILOT_CLUSTER_INFO"] = json.dumps({"cluster_name": cluster_name, "cloud": "Local", "region": None,
                                                    "zone": None})
    task_env[constants.USER_ENV_VAR] = common_utils.get_current_user_name()
    env.update(task_env)
    env[constants.SKYPILOT_NUM_GPUS_PER_NODE] = gpus_per_node(task) if gpus is None else gpus
    env[constants.SKYPILOT_NODE_RANK] = rank
    env["SKYPILOT_INTERNAL_JOB_ID"] = job_id
    return {name: str(value) for name, value in env.items()}


def node_script(task: task_lib.Task, env: dict[str, str]) -> str:
    """The file a node runs with ``/bin/bash -i`` (log_lib.run_bash_command_with_log, log_lib.py line 416): the
    task's ``run:`` behind the Ray variables' unset and followed by the cached-mount flush that exits with its status
    (TaskCodeGen.build_task_bash_script, task_codegen.py line 196, as _add_ray_task calls it), wrapped by
    log_lib.make_task_bash_script: ~/.bashrc, ``cd ~/sky_workdir``, ``export`` of every variable."""
    unset_ray = " && ".join(f"unset {name}" for name in task_codegen.UNSET_RAY_ENV_VARS)
    user_script = task_codegen.TaskCodeGen.build_task_bash_script(task.run, env_prefix=unset_ray)
    return log_lib.make_task_bash_script(user_script, env_vars=env)


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
    nodes.add_argument("--gpus", type=int, help="SKYPILOT_NUM_GPUS_PER_NODE instead of the task's count")
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
    options.out.mkdir(parents=True, exist_ok=True)
    environments = {}
    for rank in range(len(ips)):
        env = node_environment(task, ips, rank, options.job_id, options.gpus)
        (options.out / f"node-{rank}.sh").write_text(node_script(task, env))
        environments[rank] = env
    print(json.dumps(environments))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
