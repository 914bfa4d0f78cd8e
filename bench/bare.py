"""The floors of the isolation benchmark (``bench/isolation.py``): the runtimes started by hand,
with none of Souq around them.

* :class:`Launcher` — a warm Python process (``subprocess.Popen``, no C of its own) that starts
  what it is told, as the uid it is told, in a session of its own, and on request kills that
  session (or runs the commands that stop it) and reaps everything. It is a child subreaper,
  so the processes a runtime leaves behind (``runc run -d``'s container) are its children too:
  its CPU times with its children's are the runtime's whole cost, as an agent's with its
  children's are Souq's.
* :func:`runc_bundle` — an OCI bundle of a root file system: ``runc spec --rootless``'s
  config.json (pid, ipc, uts, mount and user namespaces: the set Souq's sandbox makes),
  with root inside mapped to one host uid, and the program to run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from souq.drivers.programs import DEFAULT_PATH

__all__ = ["Bare", "Launcher", "runc_bundle"]

# The launcher's loop: one JSON request a line, one JSON answer a line.
#   {"argv": [...], "uid": N, "env": {...}}      -> {"pid": P}   (P leads its own session)
#   {"kill": P, "stop": [[...], ...], "uid": N}  -> {"ok": true} (all reaped)
_LAUNCHER = r"""
import ctypes, json, os, signal, subprocess, sys
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
for line in sys.stdin:
    req = json.loads(line)
    if "argv" in req:
        uid = req["uid"]
        proc = subprocess.Popen(
            req["argv"], env=req["env"], cwd="/", user=uid, group=uid, extra_groups=[],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        proc.returncode = 0  # reaped below, with the rest; Popen must not wait for it
        print(json.dumps({"pid": proc.pid}), flush=True)
        continue
    if req.get("kill"):
        try:
            os.killpg(req["kill"], signal.SIGKILL)
        except ProcessLookupError:
            pass
    for argv in req["stop"]:
        uid = req["uid"]
        subprocess.run(argv, env=req["env"], user=uid, group=uid, extra_groups=[],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
    # What the session's kill missed (bwrap's own child leads a session of its own,
    # --new-session) is the launcher's child once its parent dies (a subreaper): kill it too.
    while True:
        left = [int(pid) for task in os.listdir("/proc/self/task")
                for pid in open(f"/proc/self/task/{task}/children").read().split()
                ] if req.get("kill") else []
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    print(json.dumps({"ok": True}), flush=True)
"""


class Launcher:
    """One launcher process; see the module docstring."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _LAUNCHER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError("the launcher exited")
        reply: dict[str, Any] = json.loads(answer)
        return reply

    def start(self, argv: list[str], uid: int, env: dict[str, str]) -> int:
        """Start ``argv`` as ``uid``; its pid (its session's too)."""
        return int(self._ask({"argv": argv, "uid": uid, "env": env})["pid"])

    def stop(self, session: int, stop: list[list[str]], uid: int, env: dict[str, str]) -> None:
        """Kill ``session``, run ``stop``'s commands as ``uid``, and reap every child."""
        self._ask({"kill": session, "stop": stop, "uid": uid, "env": env})

    def cpu_s(self) -> float:
        """Its CPU time and its reaped children's (user + system), in seconds."""
        times = psutil.Process(self.proc.pid).cpu_times()
        return float(times.user + times.system + times.children_user + times.children_system)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(10)


def runc_bundle(bundle: Path, rootfs: Path, uid: int, args: list[str], *, owner: int) -> Path:
    """An OCI bundle at ``bundle`` that runs ``args`` in ``rootfs`` (read-only, as the
    rootless spec has it), root inside being ``uid`` outside; its files are ``owner``'s (the
    user who runs ``runc`` on it). Returns the config's path: :func:`set_env` rewrites it."""
    bundle.mkdir(parents=True, exist_ok=True)
    subprocess.run(["runc", "spec", "--rootless", "--bundle", str(bundle)], check=True)
    path = bundle / "config.json"
    config = json.loads(path.read_text())
    config["root"]["path"] = str(rootfs)
    config["process"]["terminal"] = False
    config["process"]["args"] = args
    config["linux"]["uidMappings"] = [{"containerID": 0, "hostID": uid, "size": 1}]
    config["linux"]["gidMappings"] = [{"containerID": 0, "hostID": uid, "size": 1}]
    path.write_text(json.dumps(config, indent=1))
    for made in (bundle, path):
        os.chown(made, owner, owner)
    return path


def set_env(config_path: Path, env: dict[str, str]) -> None:
    """The bundle's process environment (a new one for each container)."""
    config = json.loads(config_path.read_text())
    config["process"]["env"] = [f"{k}={v}" for k, v in env.items()]
    config_path.write_text(json.dumps(config, indent=1))


class Bare:
    """The program started by a launcher of its own: ``argv`` as ``uid``, stopped by killing
    its session and running ``stop`` (as ``uid``)."""

    def __init__(
        self,
        argv: list[str],
        uid: int,
        env: dict[str, str] | None = None,
        *,
        stop: list[list[str]] | None = None,
        config: Path | None = None,  # an OCI bundle's config.json: the key goes in its env
    ) -> None:
        self.launcher = Launcher()
        self.argv = argv
        self.uid = uid
        self.env = env or {}
        self.stop_argv = stop or []
        self.config = config

    def start(self, key: str) -> tuple[str, Any]:
        program_env = {"PATH": DEFAULT_PATH, "HOME": "/root", "SOUQ_MACHINE_ID": key}
        if self.config is not None:
            set_env(self.config, program_env)
            env = self.env
        else:
            env = {**self.env, **program_env}
        return key, self.launcher.start([*self.argv], self.uid, env)

    def stop(self, session: int) -> None:
        self.launcher.stop(session, self.stop_argv, self.uid, self.env)

    def close(self) -> None:
        self.launcher.close()
