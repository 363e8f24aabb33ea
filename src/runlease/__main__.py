"""`python -m runlease ...` is the `runlease` command."""

from runlease.cli import run

run()
