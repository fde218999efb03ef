"""The multi-node launcher of the Apolo platform (``scripts/run_distributed_on_platform.sh``, a shim that runs
``python -m distqa.launch.platform``): one ``distributed_training`` job of .neuro/live.yml per node, started, watched
and killed through the flow CLI (neuro-flow or apolo-flow).

- :mod:`~distqa.launch.platform.options`: the options (flags, environment, .env), checked; its docstring is --help;
- :mod:`~distqa.launch.platform.jobs`: job names as neuro-flow builds them, the flow CLI's commands, its status;
- :mod:`~distqa.launch.platform.run`: the run: master (or store) first, the other nodes at once, the watch and its
  resubmissions of lost nodes, every job killed on failure or Ctrl-C;
- :mod:`~distqa.launch.platform.cli`: the entry point (dry run, exit statuses);
- :mod:`~distqa.launch.platform.kill`: ``scripts/kill_distributed.sh``, a run's jobs killed in the launcher's order.

Runs on the user's machine with the flow CLI on PATH; imports neither torch nor the rest of distqa but the node's
flag reader and time spans (:mod:`distqa.launch.node_options`).
"""
