"""Launchers and engines (local, Apolo, Kubernetes, Slurm, SkyPilot, Docker, sweeps), with no multi-process run."""
