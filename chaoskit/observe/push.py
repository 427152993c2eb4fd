"""The final state of a run pushed to a Pushgateway (grouped by experiment and run id), off the run's path."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, push_to_gateway

JOB = "chaoskit"


class FinalPush:
    """One push of `registry` in a daemon thread; wait() says why it failed (None: pushed), never longer than
    the timeout and a second."""

    def __init__(self, url: str, registry: CollectorRegistry, grouping: dict[str, str], timeout_s: float):
        self.url, self.registry, self.grouping, self.timeout_s = url, registry, grouping, timeout_s
        self.error: str | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._push, name="chaoskit-pushgateway", daemon=True)
            self._thread.start()

    def _push(self) -> None:
        try:
            push_to_gateway(self.url, job=JOB, registry=self.registry, grouping_key=self.grouping,
                            timeout=self.timeout_s)
        except Exception as e:  # refused, timed out, 4xx/5xx: a warning, never the run's verdict
            self.error = f"{type(e).__name__}: {e}"

    def wait(self) -> str | None:
        if self._thread is None:
            return "the run ended before its final state was known (nothing pushed)"
        self._thread.join(self.timeout_s + 1.0)
        if self._thread.is_alive():
            return f"no answer within {self.timeout_s:g}s"
        return self.error
