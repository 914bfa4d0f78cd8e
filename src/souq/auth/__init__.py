"""Who may do what: API tokens (:mod:`souq.auth.tokens`), the route table that names the scope
each API route needs (:mod:`souq.auth.routes`), and the files a cluster's credentials live in
(:mod:`souq.auth.files`)."""
