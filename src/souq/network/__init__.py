"""The private network of machines. Names (:mod:`souq.network.names`: what each ``.internal``
name answers, pure; :mod:`souq.network.name_feed`: from the cluster view to the name index;
:mod:`souq.network.dns_server`: the DNS server; :mod:`souq.network.name_service`: the three on
one worker). See docs/names.md."""

from souq.network.names import Answer, NameIndex, NameRow, Rcode, Scope

__all__ = ["Answer", "NameIndex", "NameRow", "Rcode", "Scope"]
