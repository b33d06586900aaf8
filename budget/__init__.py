"""budget: memory and communication budgets for distributed transformer plans."""

__version__ = "0.1.0"
