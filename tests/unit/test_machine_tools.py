"""The pure parts of exec, ps and cordon: a command string split as a shell splits it, output
bounded, exit codes, process rows with integer figures, and cordoned machines out of rotation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from souq.model.machine_tools import (
    EXEC_DEFAULT_TIMEOUT_S,
    EXEC_OUTPUT_MAX_BYTES,
    ExecBody,
    ProcessSnapshot,
    bounded,
    exec_argv,
    exit_code_of,
    process_stat,
)
from souq.proxy.table import Availability, Backend, RoutingTable


def test_a_fly_cmd_is_split_like_a_shell_would() -> None:
    assert exec_argv("sh -c 'echo $PORT; ls'", None) == ["sh", "-c", "echo $PORT; ls"]
    assert exec_argv('grep "a b" c\\ d', None) == ["grep", "a b", "c d"]
    assert exec_argv(None, ["echo", "a  b"]) == ["echo", "a  b"]


@pytest.mark.parametrize(
    ("cmd", "command", "says"),
    [
        ("echo 'unclosed", None, "cannot split"),
        ("   ", None, "empty"),
        (None, [], "empty"),
        ("ls", ["ls"], "not both"),
        (None, None, "not both and not neither"),
    ],
)
def test_a_bad_command_names_what_to_fix(
    cmd: str | None, command: list[str] | None, says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        exec_argv(cmd, command)


def test_the_exec_body_takes_what_flaps_sends() -> None:
    body = ExecBody.model_validate_json('{"cmd":"ls -l","stdin":"x","timeout":5}')
    assert (body.argv(), body.timeout_s()) == (["ls", "-l"], 5)
    assert ExecBody.model_validate({"cmd": "ls"}).timeout_s() == EXEC_DEFAULT_TIMEOUT_S
    assert ExecBody.model_validate({"cmd": "ls", "machine": True}).argv() == ["ls"]
    for bad in ({"cmd": "ls", "timeout": 301}, {"cmd": "ls", "container": "app"}, {"x": 1}):
        with pytest.raises(ValidationError):
            ExecBody.model_validate(bad)


def test_output_is_bounded_and_says_so() -> None:
    assert bounded(b"hello") == ("hello", False)
    text, cut = bounded(b"x" * (EXEC_OUTPUT_MAX_BYTES + 10))
    assert cut and text.startswith("x" * 100) and "truncated" in text


def test_a_signal_is_a_shells_exit_code() -> None:
    assert (exit_code_of(0), exit_code_of(3), exit_code_of(-9)) == (0, 3, 137)


def test_a_process_row_has_whole_non_negative_numbers() -> None:
    snap = ProcessSnapshot(
        pid=42,
        create_time=1000.7,
        cmdline=("python", "app.py", "a b"),
        name="python",
        cwd="/srv",
        cpu_user_s=1.25,
        cpu_system_s=0.5,
        rss=4096,
        listening=(("tcp", "127.0.0.1", 8080), ("tcp6", "::", 9090)),
    )
    row = process_stat(snap, now_s=1010.2).model_dump()
    assert row == {
        "pid": 42,
        "stime": 1000,
        "rtime": 9,
        "command": "python app.py 'a b'",
        "directory": "/srv",
        "cpu": 1750,
        "rss": 4096,
        "listen_sockets": [
            {"proto": "tcp", "address": "127.0.0.1:8080"},
            {"proto": "tcp6", "address": "[::]:9090"},
        ],
    }
    assert all(type(row[k]) is int for k in ("pid", "stime", "rtime", "cpu", "rss"))
    kernel = ProcessSnapshot(1, 0.0, (), "kthreadd", "", 0.0, 0.0, 0)
    assert process_stat(kernel, now_s=5).command == "[kthreadd]"


def backend(machine_id: str, **kw: object) -> Backend:
    return Backend(machine_id=machine_id, app="a", region="mad", host="h", port=1, **kw)  # type: ignore[arg-type]


def test_a_cordoned_machine_is_out_of_rotation_and_never_woken() -> None:
    table = RoutingTable()
    table.upsert(backend("m1", cordoned=True))
    table.upsert(backend("m2"))
    assert {table.claim("a").machine_id for _ in range(20)} == {"m2"}  # type: ignore[union-attr]
    table.upsert(backend("m2", state="stopped"))
    assert table.claim("a") is None
    assert table.availability("a") is Availability.WAKEABLE
    table.upsert(backend("m2", state="stopped", cordoned=True))
    assert table.availability("a") is Availability.NONE and not table.wakeable("a")
    table.upsert(backend("m1"))
    assert table.claim("a").machine_id == "m1"  # type: ignore[union-attr]
