"""A worked example of a fork's task: a text classifier (see README.md next to this file)."""
