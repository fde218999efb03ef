"""Checkpoints: what one holds and how it is written and read (``format``), a run's checkpoints folder
(``run_folder``), the background writer (``writer``), sharded DCP checkpoints (``sharded``) and what a resume
restores (``resume``)."""
