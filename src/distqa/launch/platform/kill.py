"""Kill the jobs of a run started by run_distributed_on_platform.sh (after the launcher itself was killed, say, or
from another terminal), or every job of this project's flow. ``scripts/kill_distributed.sh`` runs it.

Usage:
  scripts/kill_distributed.sh --run-id ID [--nodes N]   # jobs distributed_training ID-0 .. ID-(N-1),
                                                        # then rendezvous_store ID (--external-store)
  scripts/kill_distributed.sh --all                     # every running job of .neuro/live.yml

--nodes defaults to $NODES, else NODES= in .env, else 2; killing a node that is not running is harmless, so a
larger N is fine. FLOW_CLI picks apolo-flow or neuro-flow (default: whichever is installed, apolo-flow first).
`neuro-flow ps` lists what is still running. Exit status: 0 when every job was killed, 1 when a kill failed, 2 for a
usage error.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from distqa.launch.node_options import read_flags
from distqa.launch.platform.cli import REPO_ROOT
from distqa.launch.platform.jobs import Flow, FlowMissingError, find_flow_cli
from distqa.launch.platform.options import Options, UsageError, settings, whole
from distqa.launch.platform.run import Launch


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None,
         repo_root: Path = REPO_ROOT) -> int:
    """Kill what the command line names, in the launcher's order (every node, then the store); the exit status."""
    environ = os.environ if environ is None else environ
    try:
        read = read_flags(sys.argv[1:] if argv is None else argv, {"--run-id": "run_id", "--nodes": "nodes"},
                          {"--all": ("all", True)})
        if read is None:
            print(__doc__, end="")
            return 0
        flags, rest = read
        nodes = whole("--nodes", str(flags.get("nodes") or settings(environ)["nodes"]))
        if rest or not (flags.get("run_id") or flags.get("all")):
            raise UsageError("name the run with --run-id ID (the launcher printed it), or pass --all")
        cli = find_flow_cli(environ)
    except (ValueError, UsageError, FlowMissingError) as error:
        print(f"kill_distributed.sh: {error}", file=sys.stderr)
        return 2
    if flags.get("all"):
        return subprocess.run([cli, "kill", "ALL"], cwd=repo_root, check=False).returncode
    run_id = str(flags["run_id"])
    options = Options(nodes=nodes, min_nodes=nodes, preset="", external_store=True, store_preset="", run_id=run_id)
    flow = Flow(cli, options, repo_root)
    launch = Launch(flow, started=[flow.suffix(rank) for rank in range(nodes)], store_started=True)
    return 0 if launch.kill_all() else 1


if __name__ == "__main__":
    sys.exit(main())
