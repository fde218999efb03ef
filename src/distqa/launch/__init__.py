"""Before and around torchrun: a node's options and checks, torchrun's agent in the node's process, the rendezvous
store that can run apart from the nodes, the probe of its reachability, and the platform launcher (``platform/``).
Nothing here runs inside a rank; it never imports the loop, checkpoints or parallelism (pyproject.toml's contracts)."""
