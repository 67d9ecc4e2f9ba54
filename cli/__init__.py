"""The ``qstream`` command line (Typer + Rich), installed as ``cli``."""
