"""What ``python -m distqa.predict|evaluate|score|export`` run for the QA tasks' checkpoints and answer files: one
module per command, serving every QA task (``QATask.commands`` declares them; :mod:`distqa.settings.task_commands`
dispatches). Each has the command line and the one-line errors the entry point documents."""
