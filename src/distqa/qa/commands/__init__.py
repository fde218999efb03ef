"""What the question-answering tasks' commands share (``python -m distqa.predict|evaluate|score|export`` over their
checkpoints and answer files): one command line per command, its first steps and its one-line errors, and export,
which is the same for every QA task. Each task's predict, evaluate and score are its own module's
(:mod:`distqa.qa.nq.commands`, the dummy task's too; :mod:`distqa.qa.squad.commands`), which its class's ``commands``
names (:mod:`distqa.tasks.commands` dispatches); they parse their command line here and run their own
answers."""
