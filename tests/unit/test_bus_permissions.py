"""The bus's roles: what each may publish and subscribe to, and which credential an agent takes."""

from __future__ import annotations

import pytest

from souq.auth.bus import choose_worker
from souq.bus.permissions import User, nats_conf, permissions_of
from souq.errors import InvalidInput


def test_an_agent_speaks_only_as_itself() -> None:
    perms = permissions_of("agent-w1")
    assert {"souq.hb.*.w1", "souq.evt.*.w1", "souq.use.*.w1"} <= set(perms.publish)
    assert not any(s.startswith(("souq.worker", "souq.all", "souq.offers")) for s in perms.publish)
    # Of the buckets' subjects, only the batch jobs' records and outputs (it runs jobs).
    written = [s for s in perms.publish if s.startswith(("$KV", "$O", "$JS.API.>"))]
    assert written == ["$KV.souq-jobs.>", "$O.souq-job-logs.>"]
    assert "souq.worker.w1.*" in perms.subscribe
    assert not any(
        s.startswith(("souq.hb", "souq.evt", "souq.use", "souq.worker.*")) for s in perms.subscribe
    )
    assert "_INBOX.agent-w1.>" in perms.subscribe


def test_only_brokers_send_every_verb_and_the_proxy_only_its_own() -> None:
    assert "souq.worker.*.*" in permissions_of("broker").publish
    proxy = permissions_of("proxy").publish
    assert "souq.worker.*.start" in proxy and "souq.worker.*.destroy" not in proxy
    assert "souq.worker.*.*" not in proxy and "souq.worker.*.claim" not in proxy
    view = permissions_of("view").publish
    assert "souq.worker.*.get" in view and "souq.worker.*.start" not in view


def test_a_workers_names_read_what_the_view_reads_but_usage() -> None:
    names, view = permissions_of("names-w1"), permissions_of("view")
    assert names.publish == view.publish
    assert set(names.subscribe) == {"souq.hb.>", "souq.evt.>", "_INBOX.names-w1.>"}
    assert "souq.use.>" in view.subscribe


def test_a_name_that_is_no_role_is_refused() -> None:
    with pytest.raises(ValueError):
        permissions_of("admin")
    with pytest.raises(ValueError):
        permissions_of("agent-a.b")
    with pytest.raises(ValueError):
        permissions_of("names-a>")


def test_the_configuration_names_every_user_by_nkey() -> None:
    conf = nats_conf([User("broker", "UB"), User("agent-w1", "UA")])
    assert conf.count("nkey:") == 2 and '"souq.hb.*.w1"' in conf
    assert "tls {" not in conf and "no_auth_user" not in conf


def test_which_credential_an_agent_takes() -> None:
    assert choose_worker(["w1"], None, None) == "w1"  # a new agent adopts the only one
    assert choose_worker(["w1", "w2"], "w2", None) == "w2"  # its stored id's
    assert choose_worker(["w1", "w2"], None, "w1") == "w1"  # the one asked for
    with pytest.raises(InvalidInput, match="2 agent credentials"):
        choose_worker(["w1", "w2"], None, None)
    with pytest.raises(InvalidInput, match="no agent credential"):
        choose_worker([], None, None)
    with pytest.raises(InvalidInput, match="belongs to worker w9"):
        choose_worker(["w1"], "w9", None)  # a data dir of another worker: refused
    with pytest.raises(InvalidInput, match="belongs to worker w2"):
        choose_worker(["w1", "w2"], "w2", "w1")


def test_an_agent_pulls_jobs_through_the_runners_consumer_alone() -> None:
    publish = set(permissions_of("agent-w1").publish)
    assert {
        "$JS.API.CONSUMER.MSG.NEXT.souq-jobs-ready.souq-job-runners",
        "$JS.API.CONSUMER.INFO.souq-jobs-ready.souq-job-runners",
        "$JS.ACK.souq-jobs-ready.souq-job-runners.>",
        "souq.jobs.ready",
        "souq.jobevt.*.w1",
        "$JS.API.DIRECT.GET.KV_souq-jobs.>",
        "$JS.API.STREAM.INFO.OBJ_souq-job-logs",
    } <= publish
    jobs = [s for s in publish if "souq-jobs" in s or "souq-job-" in s]
    assert not any(
        verb in s for s in jobs for verb in (".DELETE.souq", ".PURGE.", ".UPDATE.", "STREAM.CREATE")
    )
    assert not any(s.endswith(("souq-jobs-ready.*", "souq-jobs-ready.>")) for s in jobs)
    # The broker makes the shared consumer: no agent may create it, change it or another.
    assert not any("CREATE.souq-jobs-ready" in s for s in publish)
    assert "souq.jobevt.>" in permissions_of("broker").subscribe


def test_a_message_is_taken_only_from_a_role_that_may_send_it() -> None:
    from souq.bus.permissions import sent_by_a_role

    def sent(subject: str, reply: str | None, headers: dict[str, str] | None = None) -> bool:
        return sent_by_a_role(subject, reply, headers, locked=True)

    assert sent("souq.worker.w1.destroy", "_INBOX.broker.abc.1")
    assert sent("souq.worker.w1.start", "_INBOX.proxy.abc.1")
    assert not sent("souq.worker.w1.destroy", "_INBOX.proxy.abc.1")  # not one of its verbs
    assert not sent("souq.worker.w1.destroy", "_INBOX.agent-w2.abc.1")
    assert not sent("souq.all.list", "_INBOX.fleet.x")
    assert sent("souq.all.list", "_INBOX.view.x.2")
    assert not sent("souq.worker.w1.destroy", "elsewhere.1")
    assert not sent("souq.worker.w1.destroy", "_INBOX.nobody.1")
    # A JetStream delivery, whatever its subject: a consumer's ack subject, a republish.
    assert not sent("souq.discover", "$JS.ACK.KV_souq-jobs.c.1.1.1.1.0")
    assert not sent("souq.evt.mad.w1", None, {"Nats-Stream": "KV_souq-jobs"})
    assert sent("souq.evt.mad.w1", None)  # a plain publish: its publisher's permissions bound it
    # An open bus (a test of one component): any inbox, still no JetStream delivery.
    assert sent_by_a_role("souq.worker.w1.destroy", "_INBOX.xyz.1", None, locked=False)
    assert not sent_by_a_role("souq.discover", "$JS.ACK.s.c.1", None, locked=False)
