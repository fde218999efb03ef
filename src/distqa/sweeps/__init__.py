"""Hyperparameter sweeps whose trials are ordinary multi-node runs (``python -m distqa.sweep``, docs/SWEEPS.md).

The pieces, each a module of plain functions with fast tests (``tests/launchers/test_sweep.py``):

- :mod:`.runner`: a sweep's run: the trials started up to ``--parallel`` at once, their ends, stops and resumes;
- :mod:`.space`: the sweep file (``configs/sweeps/NAME.toml``): the settings swept (a list, or a log or linear
  range), the seeds, the search, the budget and the pruning rule, checked in one line each;
- :mod:`.study`: the Optuna study in the sweep directory (a journal file): the search (grid in the file's order,
  random, TPE), the pruner, the trials' states and records;
- :mod:`.pruning`: what rank 0 of a trial does after each evaluation: report it to the study and ask the pruner
  (the trainer stops a pruned trial as it stops early, every rank at the same step);
- :mod:`.launch`: each trial through the launcher of its cluster (2 emulated nodes here, platform jobs, sbatch);
- :mod:`.results`: the table, the picture, the best trial and the command that reproduces it.

The sweep knows a task only through its settings class and its ``BestMetric`` (which the trials report): a fork's
task sweeps as the built-in ones do. Nothing here imports ``distqa.qa``.
"""
