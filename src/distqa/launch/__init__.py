"""Starting a node: the agent around torchrun, the node range of an elastic run, the rendezvous store that can run
apart from the nodes, the reachability probe of the rendezvous and the preflight checks before the first step.
It never imports the loop, checkpoints or parallelism (pyproject.toml's contracts)."""
