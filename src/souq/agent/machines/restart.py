"""What to do when a machine's process exits: restart it (after a backoff) or leave it stopped.

Pure. Policies follow Fly's: ``no``; ``on-failure`` restarts after a non-zero exit (or a death by
signal, or an exit whose status is unknown) at most ``max_retries`` times; ``always`` restarts
after every exit. An exit the user asked for (a stop) never restarts. The delay before restart
``n`` (counting from 0) is ``min(max_s, base_s * 2**n)``; the counter goes back to zero once a
run lasted ``reset_after_s``.
"""

from __future__ import annotations

from dataclasses import dataclass

from souq.model.machine import RestartConfig, RestartPolicy

__all__ = ["Backoff", "Decision", "decide"]

_MAX_EXPONENT = 62  # 2**62 is far past any cap; keeps the float arithmetic finite


@dataclass(frozen=True)
class Backoff:
    base_s: float = 0.1
    max_s: float = 30.0
    reset_after_s: float = 10.0

    def delay(self, n: int) -> float:
        """Seconds to wait before restart number ``n`` (0 for the first)."""
        return float(min(self.max_s, self.base_s * 2 ** min(max(n, 0), _MAX_EXPONENT)))


@dataclass(frozen=True)
class Decision:
    restart: bool
    delay_s: float
    restarts: int  # the machine's restart counter after this decision
    reason: str  # human words, kept in the exit event's message


def decide(
    config: RestartConfig,
    *,
    exit_code: int | None,
    user_stop: bool,
    restarts: int,
    ran_for_s: float,
    backoff: Backoff,
) -> Decision:
    """Decide after an exit. ``exit_code`` is None when the process died of a signal or its
    status is unknown (it was adopted from an earlier agent): both count as failures."""
    if ran_for_s >= backoff.reset_after_s:
        restarts = 0
    if user_stop:
        return Decision(False, 0.0, restarts, "stopped on request")
    if config.policy is RestartPolicy.NO:
        return Decision(False, 0.0, restarts, "restart policy is no")
    if config.policy is RestartPolicy.ON_FAILURE:
        if exit_code == 0:
            return Decision(False, 0.0, restarts, "exited with code 0; policy is on-failure")
        if restarts >= config.max_retries:
            return Decision(
                False,
                0.0,
                restarts,
                f"gave up after {restarts} restarts (max_retries is {config.max_retries})",
            )
    delay = backoff.delay(restarts)
    limit = f" of {config.max_retries}" if config.policy is RestartPolicy.ON_FAILURE else ""
    return Decision(
        True, delay, restarts + 1, f"restart {restarts + 1}{limit} in {delay:g}s ({config.policy})"
    )
