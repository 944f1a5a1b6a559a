"""The demo's live view, one envelope at a time: the readable line `describe` makes of each
envelope on the thing's topics (None for those only counted, such as metrics and file
bookkeeping), the UNS class a topic is counted under, and the `Tally` of what the view saw
(messages per class, signal updates, captures announced and failed) that the supervisor's
summary and delivery check read."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from unskit.envelope import Message
from unskit.topics import topic_class

__all__ = ["SOURCE_WIDTH", "Capture", "Tally", "describe", "uns_class"]

#: Wide enough for every component and instance name of the demo.
SOURCE_WIDTH = 19
#: Hex digits of an image's SHA-256 the live view shows.
SHA_SHOWN = 16
#: Events counted but not shown: three more lines per file would drown the view.
QUIET_EVENTS = frozenset({"file-queued", "file-completed", "file-progress"})


@dataclass
class Capture:
    """One successful capture as announced by the camera adapter."""

    camera: str
    capture_id: str
    relative_path: str
    sha256: str
    sidecar_path: str | None = None


@dataclass
class Tally:
    """What the live view saw."""

    by_class: Counter[str] = field(default_factory=Counter)
    failed_captures: Counter[str] = field(default_factory=Counter)
    captures: list[Capture] = field(default_factory=list)
    signals: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)


def uns_class(topic: str) -> str:
    """The class level of a UNS topic: data, evt, cmd, state, metric, cfg, log, app or other."""
    # Read where the layout puts it, so an instance named like a class is not the class.
    return topic_class(topic) or "other"


# -- one line per envelope ------------------------------------------------------------------


def _signal_name(body: Mapping[str, Any]) -> str:
    signal = body.get("signal") or {}
    return str(signal.get("name") or signal.get("id"))


def _number(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 2)
    if isinstance(value, list):
        return [_number(v) for v in value]
    return value


def _context(context: Mapping[str, Any], limit: int = 60) -> str:
    text = " ".join(f"{k}={v}" for k, v in context.items() if not isinstance(v, dict | list))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(topic: str, message: Message) -> str | None:
    """One readable line per envelope; None for those only counted (metrics, bookkeeping)."""
    cls = uns_class(topic)
    if cls == "metric":
        return None
    stamp = time.strftime("%H:%M:%S", time.localtime(message.header.timestamp_ms / 1000))
    identity = message.identity
    if identity is not None:
        source = identity.instance or identity.component
    else:
        # A command request carries no identity: the topic names whom it addresses.
        levels = [*topic.split("/"), "?", "?", "?", "?"]
        source = levels[3] if levels[3] != cls else levels[2]
    body = message.body if isinstance(message.body, dict) else {}
    name = message.header.name
    if name == "SouthboundSignalUpdate":
        samples = body.get("samples") or [{}]
        last = samples[-1]
        what = f"{_signal_name(body)} = {_number(last.get('value'))}"
        if last.get("quality", "GOOD") != "GOOD":
            what += f" ({last.get('quality')})"
        kind = "signal"
    elif name.startswith("ImageCapture"):
        kind = "capture"
        image = body.get("image") or {}
        if name == "ImageCaptured":
            what = (
                f"{body.get('captureId')}  {image.get('bytes')} bytes  "
                f"sha256 {str(image.get('sha256'))[:SHA_SHOWN]}"
            )
        else:
            failure = body.get("failure") or {}
            what = f"{body.get('captureId')}  {name.removeprefix('ImageCapture').lower()}"
            what += f"  {failure.get('code', '')}"
    elif name in ("Event", "Alarm"):
        context = body.get("context") or {}
        event = str(body.get("type"))
        if event in QUIET_EVENTS or (
            event == "file-delivered" and not str(context.get("file")).endswith(".jpg")
        ):
            return None
        kind = "event" if name == "Event" else "alarm"
        if event == "file-delivered":
            what = f"delivered {str(context.get('file')).rsplit('/', 1)[-1]}"
            what += f" to {context.get('destination')}"
        else:
            state = f" {body['state']}" if "state" in body else ""
            what = f"{event}{state} {_context(context)}"
    elif cls == "state":
        kind = cls
        what = topic.rsplit("/", 1)[-1]
    elif cls == "cmd":
        kind = cls
        what = f"{topic.rsplit('/', 1)[-1]} requested"
    else:
        kind = cls
        what = f"{topic.rsplit('/', 1)[-1]} ({name})"
    return f"{stamp:<8}  {kind:<7}  {source:<{SOURCE_WIDTH}}  {what.rstrip()}"
