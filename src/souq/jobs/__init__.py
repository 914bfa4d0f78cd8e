"""Batch jobs: a queue of named tasks in JetStream, claimed by whichever worker is free.

:mod:`souq.jobs.core` is the job's state table (pure), :mod:`souq.jobs.store` the queue in
JetStream's key-value store, :mod:`souq.jobs.queue` what a broker runs (the store, opened on
first use, and the sweep that requeues jobs whose lease ran out). docs/jobs.md tells the API.
"""
