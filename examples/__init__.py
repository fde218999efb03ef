"""Tasks written outside the package, as a fork writes its own (docs/FORKING.md)."""
