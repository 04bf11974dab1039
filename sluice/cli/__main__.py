"""`python -m sluice.cli`: the `sluice` command."""
from sluice.cli.main import main

main()
