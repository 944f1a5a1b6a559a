"""The recorder's command verbs: sb/status, sb/flush, sb/pause, sb/resume (reload-config
is the runtime's, served through `SignalRecorder.reconfigure`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from unskit.commands import CommandContext, ErrorCode, Verb
from unskit.errors import CommandError
from unskit.recorder.service import Recorder

__all__ = ["recorder_verbs"]


def recorder_verbs(recorder: Callable[[], Recorder | None]) -> list[Verb]:
    """The verbs, each resolving the running recorder when called."""

    def running() -> Recorder:
        found = recorder()
        if found is None:
            raise CommandError(ErrorCode.COMPONENT_STOPPING, "signal-recorder is not running")
        return found

    def status(_context: CommandContext) -> Mapping[str, Any]:
        return running().status()

    def flush(_context: CommandContext) -> Mapping[str, Any]:
        return running().flush()

    def pause(_context: CommandContext) -> Mapping[str, Any]:
        return {"paused": True, "changed": running().pause()}

    def resume(_context: CommandContext) -> Mapping[str, Any]:
        return {"paused": False, "changed": running().resume()}

    return [
        Verb("status", status, summary="open files, rows buffered, files closed, bytes, errors"),
        Verb("flush", flush, summary="close every open file now (each renamed into place)"),
        Verb("pause", pause, summary="unsubscribe and close the open files"),
        Verb("resume", resume, summary="subscribe again"),
    ]
