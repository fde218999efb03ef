"""The tests' helpers, imported by name (``from support.runs import run_training``): what more than one test file
uses lives here, never in a conftest.py (which holds fixtures and hooks only) nor in another test file.

- ``repo``: this checkout (``REPO_ROOT``, ``WORKER``, a fork or the template) and the machinery task the tests train
- ``processes``: a clean environment, free ports, waits, a node or a command run in this process, ``prepare``
- ``compare``: a run's first and last weights and how two results compare
- ``runs``: real launches of the trainer (one process, torchrun, an emulated node), their hang guards and kills
- ``shared_runs``: the runs several test files compare against, made once per session
- ``rendezvous``, ``doctor``, ``upkeep``: what the two tiers' halves of one subject share
- ``fork_tasks``, ``fork_checks``: tasks written as a fork writes them; the check every task gets
- ``sharded_checkpoint_job``: a script, one rank of a sharded-checkpoint scenario (run as a process)
- ``apolo``, ``kubernetes``, ``skypilot``: an engine's helpers (each in its optional part, template.toml)
- ``qa``, ``nq_examples``: the QA tasks' helpers (part qa: no machinery test imports them)
"""
