"""The worker's state: the SQLite file that is the source of truth about its machines
(:mod:`~souq.agent.state.store` over :mod:`~souq.agent.state.schema`), the rows it holds
(:mod:`~souq.agent.state.records`, :mod:`~souq.agent.state.hold_rows`), the op log's tables
(:mod:`~souq.agent.state.operations`: pure) and the state file's copy and restore
(:mod:`~souq.agent.state.file`)."""
