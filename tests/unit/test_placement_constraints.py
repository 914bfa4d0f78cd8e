"""Constraints: well formed or refused with a message naming the problem; evaluated against a
worker's labels, fingerprint, id and region with every operator."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from souq.model import Constraint, Fingerprint, MachineConfig, Offer, Resources, WorkerInfo
from souq.placement import attribute_of, unmet


def worker(labels: dict[str, str] | None = None, *, fingerprint: bool = True) -> Offer:
    fp = Fingerprint(
        hostname="h1", os="linux", arch="x86_64", cpus=8, memory_mb=16384, disk_mb=1000, gpus=1
    )
    return Offer(
        worker=WorkerInfo(
            id="w1",
            region="mad",
            capacity=Resources(cpus=8, memory_mb=16384),
            allocated=Resources.zero(),
            labels=labels or {},
            fingerprint=fp if fingerprint else None,
        ),
        eligible=True,
    )


def c(attribute: str, operator: str, value: Any) -> Constraint:
    return Constraint.model_validate({"attribute": attribute, "operator": operator, "value": value})


def holds(constraint: Constraint, offer: Offer) -> bool:
    return unmet(constraint, offer) is None


# -- the model -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"attribute": "labels.disk", "value": "ssd"}, "unknown attribute 'labels.disk'"),
        ({"attribute": "fingerprint.kernel", "value": "6"}, "fingerprint.<field>"),
        ({"attribute": "label.disk", "operator": "~", "value": "ssd"}, "operator"),
        ({"attribute": "label.zone", "operator": "in", "value": "a"}, "needs a non-empty list"),
        ({"attribute": "label.zone", "operator": "not_in", "value": []}, "non-empty list"),
        ({"attribute": "label.zone", "operator": "=", "value": ["a"]}, "not a list"),
        ({"attribute": "fingerprint.cpus", "operator": ">", "value": "8"}, "needs a number"),
        ({"attribute": "label.host", "operator": "regexp", "value": "web-("}, "does not compile"),
        ({"attribute": "label.disk", "value": True}, "valid"),
        ({"attribute": "label.disk", "value": "ssd", "op": "="}, "Extra inputs"),
    ],
)
def test_bad_constraints_are_refused_naming_the_problem(body: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as err:
        Constraint.model_validate(body)
    assert message in str(err.value)


def test_constraints_read_as_written() -> None:
    assert str(c("label.disk", "=", "ssd")) == "label.disk = ssd"
    assert str(c("label.zone", "in", ["a", "b"])) == "label.zone in [a, b]"
    assert str(c("fingerprint.cpus", ">=", 8)) == "fingerprint.cpus >= 8"
    assert str(c("worker.id", "regexp", "^w-[0-9]+$")) == "worker.id regexp ^w-[0-9]+$"


def test_a_machine_config_takes_constraints_and_anti_affinity() -> None:
    config = MachineConfig.model_validate(
        {
            "cmd": ["true"],
            "constraints": [{"attribute": "label.disk", "value": "ssd"}],
            "distinct_workers_for": "app",
            "image": "registry.example/web:1.2",
            "guest": {"cpus": 1, "memory_mb": 64, "disk_mb": 100, "gpus": 1},
        }
    )
    assert config.constraints[0].operator == "="
    assert config.guest.resources() == Resources(cpus=1, memory_mb=64, disk_mb=100, gpus=1)
    with pytest.raises(ValidationError, match="distinct_workers_for"):
        MachineConfig.model_validate({"cmd": ["true"], "distinct_workers_for": "worker"})
    assert config.image == "registry.example/web:1.2"
    with pytest.raises(ValidationError, match="image"):
        MachineConfig.model_validate({"cmd": ["true"], "image": "two words"})
    with pytest.raises(ValidationError, match="artifact"):  # the old field is gone, not ignored
        MachineConfig.model_validate({"cmd": ["true"], "artifact": "sha256:ab"})
    # An image brings its own command; without one, a config must name a command.
    assert MachineConfig.model_validate({"image": "sha256:" + "ab" * 32}).cmd == []
    with pytest.raises(ValidationError, match="give the command to run, or an `image`"):
        MachineConfig.model_validate({"cmd": []})
    with pytest.raises(ValidationError, match="cmd"):
        MachineConfig.model_validate({"cmd": [" "], "image": "web"})
    with pytest.raises(ValidationError, match="gpus"):
        MachineConfig.model_validate({"cmd": ["true"], "guest": {"gpus": -1}})


# -- evaluation ----------------------------------------------------------------------------


def test_attributes_come_from_labels_fingerprint_id_and_region() -> None:
    offer = worker({"disk": "ssd"})
    assert attribute_of(offer, "label.disk") == "ssd"
    assert attribute_of(offer, "label.none") is None
    assert attribute_of(offer, "fingerprint.arch") == "x86_64"
    assert attribute_of(offer, "fingerprint.cpus") == 8.0
    assert attribute_of(offer, "worker.id") == "w1"
    assert attribute_of(offer, "region") == "mad"
    assert attribute_of(worker(fingerprint=False), "fingerprint.os") is None


def test_equality_and_inequality() -> None:
    ssd, bare = worker({"disk": "ssd"}), worker()
    assert holds(c("label.disk", "=", "ssd"), ssd)
    assert not holds(c("label.disk", "=", "hdd"), ssd)
    assert not holds(c("label.disk", "=", "ssd"), bare)  # missing: not equal to anything
    assert holds(c("label.disk", "!=", "hdd"), ssd)
    assert holds(c("label.disk", "!=", "hdd"), bare)  # missing: unequal to everything
    assert not holds(c("label.disk", "!=", "ssd"), ssd)
    # Numbers compare as numbers, written the short way as text.
    assert holds(c("fingerprint.cpus", "=", 8), ssd)
    assert holds(c("fingerprint.cpus", "=", "8"), ssd)
    assert holds(c("fingerprint.os", "=", "linux"), ssd)


def test_set_membership() -> None:
    offer = worker({"zone": "b"})
    assert holds(c("label.zone", "in", ["a", "b"]), offer)
    assert not holds(c("label.zone", "in", ["c"]), offer)
    assert not holds(c("label.zone", "in", ["b"]), worker())
    assert holds(c("label.zone", "not_in", ["a", "c"]), offer)
    assert not holds(c("label.zone", "not_in", ["b"]), offer)
    assert holds(c("label.zone", "not_in", ["b"]), worker())


def test_regexp_searches_the_text() -> None:
    offer = worker({"host": "web-12"})
    assert holds(c("label.host", "regexp", r"^web-\d+$"), offer)
    assert holds(c("label.host", "regexp", "12"), offer)  # search, not match
    assert not holds(c("label.host", "regexp", "^db-"), offer)
    assert not holds(c("label.host", "regexp", ".*"), worker())
    assert holds(c("worker.id", "regexp", "^w"), offer)


def test_numeric_comparisons() -> None:
    offer = worker({"gen": "3", "name": "x"})
    assert holds(c("fingerprint.cpus", ">", 4), offer)
    assert not holds(c("fingerprint.cpus", ">", 8), offer)
    assert holds(c("fingerprint.cpus", ">=", 8), offer)
    assert holds(c("fingerprint.memory_mb", "<", 32768), offer)
    assert holds(c("fingerprint.memory_mb", "<=", 16384), offer)
    assert not holds(c("fingerprint.memory_mb", "<", 1024), offer)
    assert holds(c("label.gen", ">", 2.5), offer)  # a numeric label compares as a number
    assert not holds(c("label.name", ">", 0), offer)  # not a number: never
    assert not holds(c("label.none", "<", 10), offer)  # missing: never
    assert holds(c("fingerprint.gpus", ">=", 1), offer)


def test_unmet_says_what_the_worker_has() -> None:
    assert unmet(c("label.disk", "=", "ssd"), worker({"disk": "hdd"})) == (
        "the worker has label.disk = hdd"
    )
    assert unmet(c("label.disk", "=", "ssd"), worker()) == "the worker has no label.disk"
    assert unmet(c("fingerprint.cpus", ">", 16), worker()) == "the worker has fingerprint.cpus = 8"
