"""The cluster view: an eventually consistent, queryable SQLite view of the cluster's machines,
materialised from worker events and healed by anti-entropy; the worker table from heartbeats
(:mod:`souq.view.liveness`); the broker's event stream; region summaries. See
docs/view.md."""

from souq.view.digest import machines_digest
from souq.view.events import ClusterEvent, EventLog
from souq.view.feed import ClusterView, ViewStatus, WorkerSource
from souq.view.regions import RegionSummary, fits, summarise_regions
from souq.view.store import AppCount, ViewStore

__all__ = [
    "AppCount",
    "ClusterEvent",
    "ClusterView",
    "EventLog",
    "RegionSummary",
    "ViewStatus",
    "ViewStore",
    "WorkerSource",
    "fits",
    "machines_digest",
    "summarise_regions",
]
