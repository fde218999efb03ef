"""``python -m distqa.launch.platform``: what ``scripts/run_distributed_on_platform.sh`` runs (--help)."""

import sys

from distqa.launch.platform.cli import main

sys.exit(main())
