"""The pure parts of entering a sandboxed machine: which namespaces differ from the worker's,
ids through a user namespace's map, a process's pid inside, whether an entered root would hold
more than the machine's command, and the nsenter command line; and how a process's children
are found (a stop signal's lookup of a sandboxed command)."""

from __future__ import annotations

import subprocess

import psutil
import pytest

from souq.drivers import enter
from souq.drivers.enter import (
    Entry,
    all_caps,
    differing,
    inside_id,
    inside_pid,
    nsenter_argv,
    parse_status,
    widens,
)
from souq.testing import wait_until

HOST = {"user": 1, "mnt": 2, "pid": 3, "ipc": 4, "uts": 5, "net": 6, "cgroup": 7, "time": 8}


def test_only_the_namespaces_that_differ_are_entered_in_nsenters_order() -> None:
    sandbox = {**HOST, "mnt": 20, "pid": 30, "uts": 50, "user": 10}
    assert differing(sandbox, HOST) == ("user", "uts", "pid", "mnt")
    assert differing(HOST, HOST) == ()
    assert differing({**HOST, "net": 60}, HOST) == ("net",)
    # A kind one side lacks (an older kernel has no time namespace) is not compared.
    older = {k: v for k, v in HOST.items() if k != "time"}
    assert differing({**older, "pid": 30}, HOST) == ("pid",)
    assert differing({**HOST, "time": 80}, older) == ()


@pytest.mark.parametrize(
    ("host_id", "id_map", "inside"),
    [
        (1048577, "         0    1048577          1\n", 0),  # root inside = the machine's uid
        (65534, "     65534      65534          1\n", 65534),  # bwrap's own mapping
        (1000, "0 0 4294967295\n", 1000),  # the host's own namespace
        (100_005, "0 100000 65536\n", 5),  # a range
        (100_000 + 65536, "0 100000 65536\n", None),  # just past it
        (0, "0 1048577 1\n", None),  # host root has no name inside
        (7, "", None),
    ],
)
def test_a_host_id_is_named_through_the_user_namespaces_map(
    host_id: int, id_map: str, inside: int | None
) -> None:
    assert inside_id(host_id, id_map) == inside


def test_the_pid_inside_is_the_last_of_nspid() -> None:
    status = parse_status("Name:\tsleep\nUid:\t0\t0\t0\t0\nNSpid:\t25331\t2\n")
    assert status["Name"] == "sleep" and status["Uid"].split()[0] == "0"
    assert inside_pid(status) == 2
    assert inside_pid(parse_status("NSpid:\t4242\n")) == 4242  # the host's own namespace
    assert inside_pid({}) is None


def test_all_caps_is_every_bit_up_to_the_last() -> None:
    assert all_caps(40) == 0x1FFFFFFFFFF
    assert all_caps(0) == 1


EVERY = all_caps(40)
SANDBOX = ("user", "ipc", "uts", "pid", "mnt")


def test_an_entered_root_with_power_over_the_sandbox_widens_it() -> None:
    root = Entry(2, SANDBOX, uid=0, gid=0)
    # bwrap --unshare-user --uid 0: the user namespace owns the mounts, the command holds none.
    assert widens(root, {"mnt", "pid", "ipc", "uts"}, 0, EVERY)
    assert widens(root, {"net"} | {"mnt"}, 0, EVERY)
    # bwrap --disable-userns: the command's user namespace is a nested one that owns nothing.
    assert not widens(root, set(), 0, EVERY)
    # It owns only what is not entered.
    assert not widens(Entry(2, ("user", "pid"), uid=0, gid=0), {"mnt"}, 0, EVERY)


def test_an_entered_process_no_stronger_than_the_command_does_not_widen() -> None:
    owned = {"mnt", "pid"}
    assert not widens(Entry(2, SANDBOX, uid=65534, gid=65534), owned, 0, EVERY)  # not root
    assert not widens(Entry(2, SANDBOX, uid=0, gid=0), owned, EVERY, EVERY)  # it keeps all
    assert not widens(Entry(2, ("mnt", "pid"), uid=0, gid=0), owned, 0, EVERY)  # no userns
    assert not widens(Entry(2, SANDBOX), owned, 0, EVERY)  # keeps nsenter's ids: not 0 inside


def test_the_nsenter_line_enters_what_differs_and_takes_the_ids() -> None:
    entry = Entry(4321, ("user", "uts", "pid", "mnt"), uid=0, gid=0)
    assert nsenter_argv(entry, "/usr/bin/nsenter") == [
        "/usr/bin/nsenter",
        "--target=4321",
        "--user",
        "--uts",
        "--pid",
        "--mount",
        "--setuid=0",
        "--setgid=0",
        "--root",
        "--wd",
        "--",
    ]
    plain = nsenter_argv(Entry(7, ("ipc", "net", "pid", "mnt")))
    assert plain[:6] == ["nsenter", "--target=7", "--ipc", "--net", "--pid", "--mount"]
    assert plain[6:] == ["--root", "--wd", "--"]  # no ids: it keeps nsenter's own


def test_the_nsenter_line_names_the_working_directory_inside_when_given() -> None:
    entry = Entry(7, ("pid", "mnt"))
    assert nsenter_argv(entry, wd="/run/souq")[-3:] == ["--root", "--wdns=/run/souq", "--"]
    assert "--wd" not in nsenter_argv(entry, wd="/app")  # not the target's: nsenter refuses both


def test_a_process_children_are_read_from_its_own_proc_entry_as_psutil_finds_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The children a stop signal's lookup walks: the kernel's list of each thread's children
    (no scan of every process), the same as psutil's scan; where the kernel keeps no list,
    psutil's scan itself."""
    shell = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"])
    try:
        found = wait_until(
            lambda: (
                len(kids := [k.pid for k in psutil.Process(shell.pid).children()]) == 2 and kids
            ),
            message="two children",
        )
        assert sorted(enter._children(shell.pid)) == sorted(found)
        assert enter._oldest_child(shell.pid) in found
        monkeypatch.setattr(enter.os, "access", lambda *_: False)  # a kernel without the list
        assert sorted(enter._children(shell.pid)) == sorted(found)
    finally:
        for kid in psutil.Process(shell.pid).children():
            kid.kill()
        shell.kill()
        shell.wait()
    with pytest.raises(enter.CannotEnter):
        enter._children(shell.pid)
