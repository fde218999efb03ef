"""A run's settings as loaded: the preset, ``DISTQA_*`` variables and the command line's flags, resolved into the
chosen task's Config (``sources``). It sits above the task seam (it reads the task registry); the Config classes a
task declares its settings with stay below it, in :mod:`distqa.config`."""
