"""Fixtures of the file-egress tests: a moto S3 server and an in-process pipeline."""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.moto import MotoServer
from tests.support.tiers import server_fixture
from unskit.egress.config import (
    EgressSettings,
    InstanceSpec,
    RetryPolicy,
    SourceSpec,
    destination_spec,
)
from unskit.egress.pipeline import Pipeline
from unskit.egress.state import EgressState
from unskit.runtime.metrics import MetricsRegistry

MIB = 1024 * 1024


@server_fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log").start()
    yield server
    server.stop()


@server_fixture
def bucket(moto: MotoServer) -> str:
    name = f"b-{uuid.uuid4().hex[:12]}"
    moto.client().create_bucket(Bucket=name)
    return name


def write_file(path: Path, size: int, *, settled: bool = True) -> bytes:
    """Random content; with `settled`, an mtime far enough back that no settle time holds it.

    The file appears whole (written aside, then renamed in): with settleSeconds 0 a scan
    could otherwise queue it half-written and see it change under the transfer."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = os.urandom(size)
    fd, staged = tempfile.mkstemp(prefix="unskit-write-")
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(staged, 0o644)  # as write_bytes would have made it, not mkstemp's 0600
    if settled:
        past = time.time() - 3600
        os.utime(staged, (past, past))
    os.replace(staged, path)
    return data


class Events:
    """What the pipeline announced, in order."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str, dict[str, Any], str]] = []

    def __call__(self, severity: str, kind: str, context: Any, instance: str) -> None:
        self.items.append((severity, kind, dict(context), instance))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [context for _, k, context, _ in list(self.items) if k == kind]


class Harness:
    """Builds in-process pipelines over a state file in tmp_path; stops them all after."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.source = tmp_path / "source"
        self.pipelines: list[Pipeline] = []
        self.states: list[EgressState] = []
        self.metrics = MetricsRegistry()

    def start(
        self,
        destinations: list[dict[str, Any]],
        *,
        settle: float = 0.0,
        marker: str | None = None,
        archive: Path | None = None,
        bandwidth: int = 0,
        retry: RetryPolicy | None = None,
        include: tuple[str, ...] = ("*",),
    ) -> tuple[Pipeline, Events]:
        spec = InstanceSpec(
            id="line-1",
            source=SourceSpec(
                self.source, include=include, settle_seconds=settle, completion_marker=marker
            ),
            destinations=tuple(destination_spec(d, i) for i, d in enumerate(destinations)),
            archive_dir=archive,
            bandwidth=bandwidth,
            retry=retry or RetryPolicy(initial_backoff_ms=100, max_backoff_ms=500),
        )
        state = EgressState(self.tmp_path / "state" / "egress.sqlite3")
        events = Events()
        pipeline = Pipeline(
            EgressSettings((spec,), 0, 0.2, 1.0, None),
            state,
            metrics=self.metrics,
            events=events,
        ).start()
        self.pipelines.append(pipeline)
        self.states.append(state)
        return pipeline, events

    def stop(self, pipeline: Pipeline) -> None:
        pipeline.stop()

    def close(self) -> None:
        for pipeline in self.pipelines:
            pipeline.stop()
        for state in self.states:
            state.close()


@server_fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path)
    yield h
    h.close()


Waiter = Callable[[Callable[[], bool], float, str], None]
