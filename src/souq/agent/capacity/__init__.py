"""What the worker can take: its admission of machines against its capacity and what they
hold (:mod:`~souq.agent.capacity.admission`: pure), its load gauge
(:mod:`~souq.agent.capacity.load`) and its host ports (:mod:`~souq.agent.capacity.ports`)."""
