"""`python -m budget` is the same as the `budget` console script."""

from budget.cli import main

main()
