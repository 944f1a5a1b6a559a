"""A component for the lifecycle tests whose readiness gate a test opens with a file.

`python -m tests.edge.gated_component -c FILE` runs it as `unskit run` would. It holds its
gate shut (set_ready(False)) until the file ``component.gate`` names exists, then opens it;
when ``component.readyMarker`` is set it writes that file the first time the runtime's
readiness is on, so a test can tell "ready" without the probe server.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from unskit.runtime.component import Runtime, run_component

#: How often the gate and the readiness are looked at.
POLL_S = 0.05


class GatedComponent:
    token: ClassVar[str] = "gated"
    schema: ClassVar[Mapping[str, Any] | None] = {
        "type": "object",
        "properties": {"gate": {"type": "string"}, "readyMarker": {"type": "string"}},
        "required": ["gate"],
        "additionalProperties": False,
    }

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, runtime: Runtime) -> None:
        runtime.set_ready(False)
        section = runtime.config.component
        gate = Path(section["gate"])
        marker = Path(section["readyMarker"]) if "readyMarker" in section else None

        def follow() -> None:
            while not self._stop.wait(POLL_S) and not gate.exists():
                pass
            runtime.set_ready(True)
            while marker is not None and not self._stop.wait(POLL_S):
                if runtime.readiness is not None and runtime.readiness.is_ready():
                    marker.write_text("ready")
                    return

        self._thread = threading.Thread(target=follow, name="gated-follow", daemon=True)
        self._thread.start()

    def drain(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


if __name__ == "__main__":
    sys.exit(run_component("gated", sys.argv[1:], GatedComponent))
