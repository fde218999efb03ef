"""The loop: the trainer, the optimizer and schedule, injected faults and what a survivor does when a peer is lost."""
