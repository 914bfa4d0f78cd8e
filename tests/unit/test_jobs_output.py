"""What is kept of a job run's output: its tail, and a line saying how much of its head is not."""

from __future__ import annotations

from souq.jobs.output import OUTPUT_MAX_BYTES, kept, object_name


def test_the_output_kept_is_the_tail_and_says_what_is_missing() -> None:
    assert kept(b"short\n", 0) == b"short\n"
    long = b"x" * (OUTPUT_MAX_BYTES + 10) + b"end\n"
    out = kept(long, 0)
    assert len(out) <= OUTPUT_MAX_BYTES and out.endswith(b"end\n")
    head, _, tail = out.partition(b"\n")
    assert head.startswith(b"[souq: the first ") and b" bytes of this run" in head
    dropped = int(head.split()[3])
    assert dropped + len(tail) == len(long)
    note = kept(b"tail\n", 5000)
    assert note == b"[souq: the first 5000 bytes of this run's output were not kept]\ntail\n"


def test_each_run_is_an_object_of_its_own() -> None:
    assert object_name("nightly", 3) == "nightly/3"
