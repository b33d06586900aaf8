"""`python -m budget` is the same as the `budget` console script."""

from budget.entry import main

main()
