"""A fork keeps up with the template: who owns each path (``template.toml``), the fork's record (``fork.toml``),
``make new-fork`` and ``make update-template`` (docs/FORKING.md). Standard library and git only, so that a newer
template's copy of this package runs on a fork before any environment exists."""
