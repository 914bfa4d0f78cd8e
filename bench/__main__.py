"""Run the benchmarks, or those named: ``python -m bench [spine scale c1m ...]``.

Without names, the default suites run (``spine``, ``scale``, ``tradeoff``, ``view``,
``supervise``, ``creates``, ``proxy``, ``wake``, ``images``, ``isolation``, ``deploy``, ``attack``,
``secured``, ``logs``, ``cli``, ``names``); ``c1m`` (100,000 machines onto 5,000 hollow
workers, a few minutes) runs only when named, as do ``hosts``, ``jobs``, ``private_network``,
``network_take``, ``crosshost`` and ``dnsperf`` (root), ``keyed`` (creates with and without
an ``Idempotency-Key``), and ``wire`` (one create's bus
messages encoded and decoded, timed apart). At the end, every ratio the suites measured is
printed as one table (:mod:`bench.table`)."""

from __future__ import annotations

import sys
import time

from bench import (
    attack,
    cli,
    creates,
    crosshost,
    deploy,
    dnsperf,
    hosts,
    images,
    isolation,
    jobs,
    keyed,
    logs,
    names,
    network_take,
    preempt,
    private_network,
    proxy,
    quotas,
    scale,
    secured,
    spine,
    supervise,
    table,
    view,
    wake,
    wire,
)

SUITES = {
    "spine": spine.main,
    "scale": scale.main_scale,
    "tradeoff": scale.main_tradeoff,
    "c1m": scale.main_c1m,
    "view": view.main,
    "supervise": supervise.main,
    "creates": creates.main,
    "quotas": quotas.main,
    "preempt": preempt.main,
    "proxy": proxy.main,
    "wake": wake.main,
    "images": images.main,
    "isolation": isolation.main,
    "deploy": deploy.main,
    "attack": attack.main,
    "secured": secured.main,
    "hosts": hosts.main,
    "jobs": jobs.main,
    "keyed": keyed.main,
    "logs": logs.main,
    "cli": cli.main,
    "names": names.main,
    "dnsperf": dnsperf.main,
    "private_network": private_network.main,
    "network_take": network_take.main,
    "crosshost": crosshost.main,
    "wire": wire.main,
}
DEFAULT = [
    "spine",
    "scale",
    "tradeoff",
    "view",
    "supervise",
    "creates",
    "proxy",
    "wake",
    "images",
    "isolation",
    "deploy",
    "attack",
    "secured",
    "logs",
    "cli",
    "names",
]


def main(argv: list[str]) -> None:
    names = argv or DEFAULT
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {unknown}; choose from {sorted(SUITES)}")
    since = time.time()
    for name in names:
        SUITES[name]()
    table.report(names, since, "python -m bench " + " ".join(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
