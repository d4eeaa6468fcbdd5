"""The integration tier's shared fixtures: the embedded broker's file, clock and
store (:mod:`tests.integration.broker_fixtures`); a module defining its own
fixture of the same name uses its own."""

from tests.integration.broker_fixtures import clock, path, store  # noqa: F401 - fixtures
