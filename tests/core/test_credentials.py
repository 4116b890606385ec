"""optrace.credentials.run_as: the work runs in a thread holding the user's credentials, and only that thread
(the raw system calls change the calling thread's alone; glibc's wrappers would change every thread's, root
optrace's own included)."""
from __future__ import annotations

import os
import threading

import pytest

from optrace.credentials import (CAP_DAC_OVERRIDE, Credentials, CredentialsError, _take, process_credentials,
                                 run_as)
from optrace.procfs import status_fields

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="takes other users' credentials")

USER, GROUP = 64011, 64012  # no account needed: the kernel checks numbers


def held() -> tuple[int, int, str, int]:
    """The calling thread's fs uid, fs gid, groups and effective capabilities, as the kernel shows them."""
    fields = status_fields(threading.get_native_id())
    return (int(fields["Uid"].split()[3]), int(fields["Gid"].split()[3]), fields.get("Groups", "").strip(),
            int(fields["CapEff"], 16))


def test_the_work_holds_the_users_credentials_and_no_capability() -> None:
    assert run_as(Credentials(USER, USER, (GROUP,)), held, 10) == (USER, USER, str(GROUP), 0)
    with_override = run_as(Credentials(USER, USER, (), 1 << CAP_DAC_OVERRIDE), held, 10)
    assert with_override == (USER, USER, "", 1 << CAP_DAC_OVERRIDE)


def test_no_other_thread_changes() -> None:
    """Ours and one that runs meanwhile keep root's."""
    before = held()
    seen: list = []
    entered, leave = threading.Event(), threading.Event()
    bystander = threading.Thread(target=lambda: (entered.wait(10), seen.append(held()), leave.set()))
    bystander.start()

    def work() -> tuple:
        entered.set()
        leave.wait(10)
        return held()

    assert run_as(Credentials(USER, USER), work, 20)[:2] == (USER, USER)
    bystander.join(10)
    assert held() == before and seen == [before] and before[:2] == (0, 0)


def test_a_file_the_user_cannot_open_is_refused(tmp_path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("x")
    os.chmod(secret, 0o600)
    with pytest.raises(PermissionError):
        run_as(Credentials(USER, USER), lambda: open(secret).read(), 10)  # noqa: SIM115 - closed with the thread
    assert run_as(Credentials(0, 0, (), 1 << CAP_DAC_OVERRIDE), lambda: secret.read_text(), 10) == "x"


def test_errors_and_time_outs_reach_the_caller() -> None:
    with pytest.raises(TimeoutError):
        run_as(Credentials(USER, USER), lambda: threading.Event().wait(2), 0.1)
    with pytest.raises(ZeroDivisionError):
        run_as(Credentials(USER, USER), lambda: 1 // 0, 10)


def test_credentials_the_thread_cannot_take_are_an_error() -> None:
    """A thread that already gave up its capabilities cannot take another user's (optrace without
    CAP_SETUID/CAP_SETGID): CredentialsError, not work done with the wrong ones."""
    def twice() -> None:
        _take(Credentials(USER, USER))
        _take(Credentials(USER + 1, USER + 1))  # setfsuid/setfsgid fail silently: the check after says so

    with pytest.raises(CredentialsError):
        run_as(Credentials(USER, USER), twice, 10)


def test_a_processes_credentials() -> None:
    own = process_credentials(os.getpid())
    assert own is not None and (own.uid, own.gid) == (0, 0) and own.capabilities & 1 << CAP_DAC_OVERRIDE
    assert process_credentials(2 ** 22 + 1) is None  # no such pid
