"""``python -m relay``: the ``relay`` command (how ``relay start --processes N``
starts its children with the same interpreter and installation)."""

from relay.entrypoints.cli import main

main()
