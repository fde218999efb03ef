"""The machinery's tests that start real multi-process torchrun/gloo runs (marked ``distributed`` by the conftest)."""
