"""The run's record: its folder (``rundir``), the per-step metrics and logs (``metrics``), the hardware-peak
arithmetic behind MFU (``throughput``) and the trackers, TensorBoard and MLflow (``tracking``)."""
