"""The worker's machines: the executor that runs every operation on one
(:mod:`~souq.agent.machines.executor`, over the records in memory of
:mod:`~souq.agent.machines.table`, stepping the pure tables of
:mod:`~souq.agent.machines.lifecycle` and :mod:`~souq.agent.machines.restart`), and what serves
it: the commands (:mod:`~souq.agent.machines.commands`, :mod:`~souq.agent.machines.batch`),
the process's steps and exits, recovery at start, supervision and checks, quotes, leases,
evictions and spot prices, images and secrets, reads and in-place tools."""
