"""``python -m cli``: the ``qstream`` console script (:func:`cli.launch.console`)."""

from .launch import console

console()
