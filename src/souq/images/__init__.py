"""OCI images: pack a directory, write and read the OCI image layout, unpack layers safely.

* :mod:`~souq.images.oci` — :class:`Image` and its descriptors, :func:`pack_directory`, the
  image layout (:func:`layout_tar`, :func:`write_layout`, :func:`read_layout`);
* :mod:`~souq.images.layers` — one layer tar: packed deterministically, unpacked safely
  (:func:`unpack_layer`, whiteouts included);
* :mod:`~souq.images.store` — the cluster's image store in JetStream (I/O; import it apart);
* :mod:`~souq.images.cache` — a worker's cache: each layer pulled once, each image unpacked once,
  least recently used evicted within a limit (import it apart).
"""

from souq.images.layers import unpack_layer
from souq.images.oci import (
    Descriptor,
    Image,
    RunConfig,
    layout_tar,
    pack_directory,
    read_layout,
    read_layout_bytes,
    verify_blob,
    write_layout,
)

__all__ = [
    "Descriptor",
    "Image",
    "RunConfig",
    "layout_tar",
    "pack_directory",
    "read_layout",
    "read_layout_bytes",
    "unpack_layer",
    "verify_blob",
    "write_layout",
]
