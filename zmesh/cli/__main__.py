"""``python -m zmesh.cli``: the same as the ``zmesh`` command."""

from .main import main

main()
