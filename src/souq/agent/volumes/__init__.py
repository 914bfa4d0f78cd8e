"""The worker's volumes: their life (:mod:`~souq.agent.volumes.worker_volumes`), their rows
in the state file (:mod:`~souq.agent.volumes.rows`), their sizes enforced on disk
(:mod:`~souq.agent.volumes.disks`) and the answers to the volume verbs
(:mod:`~souq.agent.volumes.verbs`)."""
