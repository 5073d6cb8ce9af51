"""What happened to one kernel backend in this process (for logs, manifests and benchmarks)."""

from __future__ import annotations

from typing import Any


class Status:
    def __init__(self) -> None:
        self.ready: bool | None = None  # None: not tried yet
        self.error: str | None = None
        self.seconds: float | None = None
        self.detail: dict[str, Any] = {}

    def as_dict(self) -> dict[str, Any]:
        return {"ready": self.ready, "error": self.error, "seconds": self.seconds, **self.detail}
