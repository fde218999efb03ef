"""How the model is spread over the ranks: DDP's wrap (``ddp``) and FSDP2's sharding (``fsdp``)."""
