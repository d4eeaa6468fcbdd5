"""The web console (``CONSOLE_ADDR``): see :mod:`relay.entrypoints.console.server`."""
