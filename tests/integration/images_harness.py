"""What the image tests share: the `souq` CLI run against a cluster, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from souq.testing import Cluster

SOUQ = str(Path(sys.executable).with_name("souq"))


def souq(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SOUQ_API": cluster.api_url}
    return subprocess.run(
        [SOUQ, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )
