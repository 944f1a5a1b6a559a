"""A component with sample verbs of every scope and kind, driven by the inbox tests in-process
and, for restarts, as a process: ``python -m tests.commands.sample_component -c F -t T``."""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any, ClassVar

from unskit.commands import (
    BodySpec,
    Boolean,
    CommandContext,
    ErrorCode,
    Integer,
    JsonObject,
    Kind,
    Number,
    Page,
    Param,
    ReloadOutcome,
    RequestIdRule,
    Scope,
    Text,
    Verb,
)
from unskit.config.model import ComponentConfig
from unskit.errors import CommandError
from unskit.runtime.component import Runtime, run_component

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "token": {"type": "string"},
        "instances": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"id": {"type": "string"}, "gain": {"type": "number"}},
                "required": ["id"],
            },
        },
    },
}

#: Verb name -> scope, for the parametrised addressing tests.
SCOPES = {
    "ping": Scope.COMPONENT,
    "status": Scope.BOTH,
    "pause": Scope.INSTANCE,
    "set-point": Scope.INSTANCE,
    "job": Scope.INSTANCE,
    "job-submit": Scope.INSTANCE,
    "list-items": Scope.COMPONENT,
    "reset": Scope.COMPONENT,
}


def _instances(config: ComponentConfig) -> dict[str, Mapping[str, Any]]:
    found: dict[str, Mapping[str, Any]] = {}
    for entry in config.component.get("instances", ()):
        found.setdefault(entry["id"], entry)  # the first of duplicate ids wins
    return found


class SampleComponent:
    token: ClassVar[str] = "sample"
    schema: ClassVar[Mapping[str, Any] | None] = SCHEMA

    def __init__(self) -> None:
        self.instances: dict[str, Mapping[str, Any]] = {}
        self.paused: set[str] = set()
        self.executions: dict[str, int] = {}
        self.refusals_left = 0
        self.generation = 0
        self.jobs: dict[str, Future[Mapping[str, Any]]] = {}
        self.reconfigure_entered = threading.Event()
        self.reconfigure_release = threading.Event()
        self.reconfigure_release.set()
        # Cleared by a test to hold set-point's handler until it is set again.
        self.set_point_release = threading.Event()
        self.set_point_release.set()
        self.set_point_entered = threading.Event()
        self._timers: list[threading.Timer] = []
        self._lock = threading.Lock()

    def start(self, runtime: Runtime) -> None:
        self.instances = _instances(runtime.config)
        inbox = runtime.command_inbox(lambda: tuple(self.instances))
        for verb in self.verbs():
            inbox.register(verb)

    def verbs(self) -> list[Verb]:
        return [
            Verb("ping", self._ping, summary="liveness of the inbox"),
            Verb("status", self._status, scope=Scope.BOTH),
            Verb("pause", self._pause, scope=Scope.INSTANCE),
            Verb(
                "set-point",
                self._set_point,
                scope=Scope.INSTANCE,
                request_id=RequestIdRule.REQUIRED,
                body=BodySpec(
                    {
                        "value": Param(Number(minimum=0, maximum=1000), required=True),
                        "label": Param(Text(max_bytes=64)),
                        "metadata": Param(JsonObject(max_bytes=1024)),
                    }
                ),
            ),
            Verb(
                "job",
                self._job,
                scope=Scope.INSTANCE,
                kind=Kind.DEFERRED,
                request_id=RequestIdRule.REQUIRED,
                body=BodySpec(
                    {
                        "durationMs": Param(Integer(minimum=0, maximum=600_000), default=0),
                        "fail": Param(Boolean()),
                    }
                ),
            ),
            Verb(
                "job-submit",
                self._job_submit,
                scope=Scope.INSTANCE,
                request_id=RequestIdRule.REQUIRED,
                body=BodySpec(
                    {"durationMs": Param(Integer(minimum=0, maximum=600_000), default=0)}
                ),
            ),
            Verb("list-items", self._list_items, paged=True),
            Verb(
                "reset",
                self._reset,
                request_id=RequestIdRule.CONDITIONAL,
                request_id_needed=lambda body: not body.get("dryRun", False),
                body=BodySpec({"dryRun": Param(Boolean())}),
            ),
            Verb("refuse", self._refuse, request_id=RequestIdRule.REQUIRED),
            Verb("boom", self._boom),
            Verb(
                "discover",
                self._ping,
                enabled=False,
                disabled_reason="discovery is off (discovery.enabled is false)",
            ),
        ]

    # -- handlers ---------------------------------------------------------------------------

    def _count(self, key: str) -> int:
        with self._lock:
            self.executions[key] = self.executions.get(key, 0) + 1
            return self.executions[key]

    def _ping(self, context: CommandContext) -> Mapping[str, Any]:
        return {"pong": True}

    def _status(self, context: CommandContext) -> Mapping[str, Any]:
        if context.instance is None:
            return {"instances": sorted(self.instances)}
        return {"instance": context.instance, "paused": context.instance in self.paused}

    def _pause(self, context: CommandContext) -> Mapping[str, Any]:
        assert context.instance is not None
        changed = context.instance not in self.paused
        self.paused.add(context.instance)
        return {"instance": context.instance, "changed": changed}

    def _set_point(self, context: CommandContext) -> Mapping[str, Any]:
        self.set_point_entered.set()
        if not self.set_point_release.wait(30):
            raise TimeoutError("set-point was held for 30 s")
        count = self._count(f"set-point/{context.instance}")
        return {
            "instance": context.instance,
            "value": context.body["value"],
            "execution": count,
        }

    def _job(self, context: CommandContext) -> Future[Mapping[str, Any]]:
        future: Future[Mapping[str, Any]] = Future()
        job_id = f"job_{uuid.uuid4().hex[:12]}"
        self._count("job")
        fail = context.body.get("fail", False)

        def finish() -> None:
            if fail:
                future.set_exception(CommandError(ErrorCode.BACKEND_ERROR, "the job failed"))
            else:
                future.set_result({"jobId": job_id, "state": "SUCCEEDED"})

        timer = threading.Timer(context.body["durationMs"] / 1000, finish)
        timer.daemon = True
        self._timers.append(timer)
        self.jobs[job_id] = future
        timer.start()
        return future

    def _job_submit(self, context: CommandContext) -> Mapping[str, Any]:
        self._count("job-submit")
        return {"jobId": f"job_{uuid.uuid4().hex[:12]}", "state": "ACCEPTED"}

    def _list_items(self, context: CommandContext) -> Page:
        # Each first page takes a new generation: continuations must keep the old one.
        with self._lock:
            self.generation += 1
            generation = self.generation
        items = [{"index": i, "generation": generation} for i in range(250)]
        return Page(items, extra={"total": len(items)})

    def _reset(self, context: CommandContext) -> Mapping[str, Any]:
        return {"dryRun": context.body.get("dryRun", False), "execution": self._count("reset")}

    def _refuse(self, context: CommandContext) -> Mapping[str, Any]:
        with self._lock:
            if self.refusals_left > 0:
                self.refusals_left -= 1
                raise CommandError(ErrorCode.QUEUE_FULL, "the queue is full")
        return {"accepted": True, "execution": self._count("refuse")}

    def _boom(self, context: CommandContext) -> Mapping[str, Any]:
        raise RuntimeError("a handler bug")

    # -- lifecycle --------------------------------------------------------------------------

    def reconfigure(self, config: ComponentConfig) -> ReloadOutcome:
        self.reconfigure_entered.set()
        self.reconfigure_release.wait(30)
        candidate = _instances(config)
        outcome = ReloadOutcome(
            started=[i for i in candidate if i not in self.instances],
            stopped=[i for i in self.instances if i not in candidate],
            kept=[i for i in candidate if self.instances.get(i) == candidate[i]],
        )
        restarted = [
            i for i in candidate if i in self.instances and self.instances[i] != candidate[i]
        ]
        self.instances = candidate
        self.paused -= set(outcome.stopped) | set(restarted)
        return ReloadOutcome(
            started=[*outcome.started, *restarted], stopped=outcome.stopped, kept=outcome.kept
        )

    def drain(self) -> None:
        for timer in self._timers:
            timer.cancel()


if __name__ == "__main__":
    sys.exit(run_component("sample", sys.argv[1:], SampleComponent))
