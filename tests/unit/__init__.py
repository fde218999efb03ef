"""The machinery's tests that start no multi-process run: in process, or a short-lived subprocess."""
