"""Commits made to hurt the worker, synced from the real SSH git server: a
``--path`` that leaves the checkout through a committed symbolic link, and a
function directory whose name is not UTF-8, through the CLI and through the
worker's own sync loop (the real scheduler and the real sync service)."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from structlog.testing import capture_logs

from relay.adapters.git.files import GitPaths
from relay.adapters.git.sync import GitSyncService
from relay.domain.events import GitSyncFinished
from relay.domain.git import SyncSummary
from relay.domain.messages import DomainEvent
from tests.e2e.test_git_cli import TEMPLATE, Operator, operator, repo  # noqa: F401
from tests.fakes_compose import sync_loop
from tests.gitbed import BareRepo

pytestmark = [pytest.mark.e2e, pytest.mark.git]


def test_a_path_through_a_committed_symlink_is_refused_and_nothing_outside_is_served(
    operator: Operator, repo: BareRepo, tmp_path: Path  # noqa: F811
) -> None:
    """Before: only the last component was checked, so ``a/fns`` with ``a`` a link
    to a directory outside the checkout copied that directory's functions."""
    outside = tmp_path / "outside"
    (outside / "fns" / "stolen").mkdir(parents=True)
    (outside / "fns" / "stolen" / "template.yaml").write_text(TEMPLATE)
    (repo.work / "a").symlink_to(outside)  # committed as a symbolic link
    repo.commit({})
    code, _, err = operator.relay("git", "set", repo.url, "--path", "a/fns")
    assert code == 0, err
    code, _, err = operator.sync()
    assert code == 1
    assert err.startswith("relay: path 'a/fns' leads outside the checkout (through a "
                          "symbolic link) in main at commit ")
    assert err.endswith("; the functions were left as they were\n")
    assert len(err.splitlines()) == 1
    assert operator.served() == {}
    # a link that stays inside the checkout is followed
    repo.commit({"inner/fns/hello/template.yaml": TEMPLATE, "inner/fns/hello/main.py": "v1"})
    (repo.work / "b").symlink_to("inner")
    repo.commit({})
    code, _, err = operator.relay("git", "set", repo.url, "--path", "b/fns")
    assert code == 0, err
    code, _, err = operator.sync()
    assert code == 0, err
    assert operator.served() == {"hello/template.yaml": TEMPLATE, "hello/main.py": "v1"}


def _commit_bad_name(bare: BareRepo) -> None:
    bad = os.fsencode(bare.work) + b"/caf\xe9"  # Latin-1, not UTF-8
    os.mkdir(bad)
    with open(bad + b"/template.yaml", "w") as handle:
        handle.write(TEMPLATE)
    bare.commit({})


def test_a_non_utf8_directory_name_is_refused_in_one_line_by_the_cli(
    operator: Operator, repo: BareRepo  # noqa: F811
) -> None:
    code, _, err = operator.sync()
    assert code == 0, err
    _commit_bad_name(repo)
    code, out, err = operator.sync(real=True)
    assert code == 1
    assert err == ("relay: directory 'caf\\xe9' is not a UTF-8 name; rename it in the "
                   "repository (the functions were left as they were)\n")
    assert operator.served() == {"hello/template.yaml": TEMPLATE, "hello/main.py": "v1"}
    code, out, _ = operator.relay("git", "status")
    assert code == 0
    assert "is not a UTF-8 name" in out


@pytest.mark.anyio
async def test_the_worker_sync_loop_survives_a_non_utf8_name_and_keeps_the_last_good_functions(
    operator: Operator, repo: BareRepo  # noqa: F811
) -> None:
    """Before: ``save_state`` raised UnicodeEncodeError after the functions directory
    was replaced, the scheduler did not catch it, and the exception ended
    ``relay start``'s task group."""
    service = GitSyncService(GitPaths(operator.state), operator.functions, clock=lambda: 0.0,
                             wait_for_lock=True)
    finished: list[GitSyncFinished] = []

    def notify(event: DomainEvent) -> None:
        if isinstance(event, GitSyncFinished):
            finished.append(event)

    async def sync() -> SyncSummary:
        return (await service.sync()).summary()

    scheduler = sync_loop(sync, notify)
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            await tg.start(scheduler.run)
            scheduler.request()
            with anyio.fail_after(60):
                while len(finished) < 1:  # noqa: ASYNC110 - polling a plain list
                    await anyio.sleep(0.01)
            assert finished[0].ok
            _commit_bad_name(repo)
            scheduler.request()
            with anyio.fail_after(60):
                while len(finished) < 2:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            assert not finished[1].ok
            assert "is not a UTF-8 name" in (finished[1].error or "")
            assert operator.served() == {"hello/template.yaml": TEMPLATE, "hello/main.py": "v1"}
            # the loop is alive: the fixed commit syncs
            good = repo.commit({"hello/main.py": "v2"}, remove=("caf\udce9",))
            scheduler.request()
            with anyio.fail_after(60):
                while len(finished) < 3:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            assert finished[2].ok
            assert finished[2].commit == good
            tg.cancel_scope.cancel()
    assert operator.served() == {"hello/template.yaml": TEMPLATE, "hello/main.py": "v2"}
    failed = [e for e in logs if e["event"] == "git_sync_failed"]
    assert len(failed) == 1
    assert "\n" not in failed[0]["error"]

