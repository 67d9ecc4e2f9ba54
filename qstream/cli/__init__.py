"""The ``qstream`` command line (Typer + Rich), installed as ``qstream.cli``."""
