"""souq.netns without root: why hosts cannot be built, and the names a network would use."""

from __future__ import annotations

import shutil

import pytest

from souq import netns
from souq.netns import Network


def test_not_root_is_a_clear_reason_to_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    reason = netns.missing()
    assert reason is not None and "root" in reason


def test_a_missing_tool_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns.os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda t: None if t == "iptables" else "/bin/" + t)
    reason = netns.missing()
    assert reason is not None and "iptables" in reason and "apt-get install" in reason


@pytest.mark.parametrize("tag", [1, 4_194_304])  # the largest pid Linux hands out
def test_names_fit_a_device_name_and_are_swept_by_their_pid(tag: int) -> None:
    net = Network(200, tag=tag)
    names = [net.bridge, *(h.veth for h in net.hosts), *(h.namespace for h in net.hosts)]
    assert all(len(name) <= 13 for name in names)  # IFNAMSIZ: 15, and the "p" of a peer
    for name in names:
        found = netns._NAME.match(name)
        assert found is not None and found[1] == str(tag), name
    addresses = [h.address for h in net.hosts]
    assert len(set(addresses)) == 200 and net.root_address not in addresses
    assert len({a.rsplit(".", 1)[0] for a in addresses}) == 1  # one /24


def test_others_names_are_not_ours() -> None:
    for name in ("eth0", "sqbr", "sq12x", "docker0", "sq12h", "sq12v"):
        assert netns._NAME.match(name) is None
