"""`python -m flashtune.cli`: the `flashtune` command."""

from flashtune.cli import main

main()
