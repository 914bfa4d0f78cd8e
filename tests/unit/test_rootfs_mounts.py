"""Which mounts a worker's data directory leaves in a mount table, in the order they come down."""

from __future__ import annotations

from souq.drivers.rootfs import mounts_under

TABLE = b"""\
22 1 0:21 / / rw - ext4 /dev/vda rw
45 22 7:0 / /var/lib/souq/w1/volumes/vol_a rw - ext4 /dev/loop0 rw
46 22 0:50 / /var/lib/souq/w1/machines/.rootfs/m1/layers/lower rw - ext4 /dev/vda rw
47 22 0:51 / /var/lib/souq/w1/machines/.rootfs/m1/root rw - overlay overlay rw
48 22 0:52 / /var/lib/souq/w10/machines/.rootfs/m2/root rw - overlay overlay rw
49 22 0:53 / /var/lib/souq/w1/with\\040space rw - tmpfs tmpfs rw
"""


def test_the_mounts_under_a_directory_deepest_first_and_no_neighbours() -> None:
    found = mounts_under(TABLE, "/var/lib/souq/w1")
    assert found == [
        "/var/lib/souq/w1/machines/.rootfs/m1/layers/lower",
        "/var/lib/souq/w1/machines/.rootfs/m1/root",
        "/var/lib/souq/w1/volumes/vol_a",
        "/var/lib/souq/w1/with space",
    ]
    assert mounts_under(TABLE, "/var/lib/souq/w1/machines/.rootfs") == found[:2]
    assert mounts_under(TABLE, "/elsewhere") == []
