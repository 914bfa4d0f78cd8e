"""The worker's batch jobs: the runner that pulls and runs them
(:mod:`~souq.agent.jobs.runner`), its decisions (:mod:`~souq.agent.jobs.rules`: pure) and a
job's process (:mod:`~souq.agent.jobs.process`)."""
