# Names vulture (run by .ci/run at min_confidence 60, see [tool.vulture] in
# pyproject.toml) reports as unused in src/ but that are used, from outside what
# it can see. Each group says who uses them; a name dead for real is deleted, not
# added here. Not imported by anything: vulture only reads the names.
# ruff: noqa
# mypy: ignore-errors
from vulture.whitelist_utils import Whitelist

_ = Whitelist()

# typer registers these through @app.command: the CLI calls them.
rm  # relay dlq rm, relay secret rm
replay  # relay dlq replay
keygen  # relay git keygen
set_  # relay git set, relay secret set

# click/typer call overrides and set attributes by name.
_.display_type_rich  # help_format: click's hook
_.format_commands  # lazy: click's hook
_._custom_shell_complete  # completion: click reads it
_._runtime_param  # plain_values: typer reads it
_.__class__  # help_format: the parameter's class is swapped on purpose
_.use_24hour_time_format  # cron_text: cron-descriptor's option

# The standard library and the driver read these attributes.
_.gid  # dockerfiles: tarfile.TarInfo fields of the build context
_.gname
_.uname
_.mtime  # dockerfiles, services: TarInfo
_.isolation_level  # sqlite/db: sqlite3.Connection
warn  # logging._LineLogger: structlog calls the final logger's method by level name
critical
fatal

# Fields of data the outside reads: msgspec encodes them to the control socket's
# answers and the --json documents, or the dataclass is a parsed value.
enabled  # application/breakers.BreakerSnapshot (relay function inspect)
probe_in_s
user  # domain/git.SshUrl: parsed with the address (git is handed the URL text itself)
created_at  # adapters/docker/containers.WarmContainer (the lead's hot path: left for it)
C  # application/bus: the TypeVar of the handler table's signature

# Counters of real components that tests and benchmarks observe (no fake to record
# them): the memory bound, batch sizes, waits, refusals.
_.queued  # linewriter (tests/unit/test_linewriter.py: the queue stays bounded)
_.commits  # sqlite broker store (bench/broker.py, tests: steps per commit)
_.steps
_.waits  # docker pool (tests/unit/test_runtime_pool.py)
_.timeouts_total  # application/concurrency (tests/unit/test_concurrency.py)
_.timed_out  # git webhook guard (tests/integration/test_git_webhook_limits.py)
_.oversized
_.handled_commands  # the bus: the test that every command has its handler
CONTROL_COMMANDS  # control protocol: the test that every control command has a sample

# Used by tools outside src/: a script, a benchmark, the property test's reference.
render  # domain/template_schema: scripts/template-schema writes the JSON Schema
ACK_SQL  # sqlite broker ledger: bench/broker.py's raw ack loop
_.match_linear  # domain/rule_index: the reference the index is proven equal to
delayed_id  # domain/publication: the fake publisher makes Redis's delayed ids with it
db_path  # adapters/sqlite/db: the tests name the state database with it
