"""The signal-recorder `component` section, parsed into `RecorderSettings`.

The schema refuses unknown keys and wrong types with their JSON path; the rules a schema
cannot say (a topic filter's wildcards, duplicate filters, pyarrow installed) are checked
here, also with their JSON path."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unskit import errors
from unskit.config.model import ComponentConfig, thaw
from unskit.config.rules import directory_problem
from unskit.config.schema import load_schema
from unskit.errors import ConfigError, ConfigIssue
from unskit.messaging.groups import ConsumerGroupConfig, GroupMode, consumer_group_from_section

__all__ = [
    "DEFAULT_PARTITIONS",
    "TOKEN",
    "RecorderSettings",
    "RollPolicy",
    "component_schema",
    "configuration_issues",
    "default_filter",
    "extra_installed",
    "missing_extra",
    "parse_component",
]

TOKEN = "signal-recorder"
SCHEMA_FILE = "signal-recorder.schema.json"
EXTRA = "recorder"
DEFAULT_PARTITIONS = ("date", "hour", "device", "component", "instance")
DEFAULT_QUEUE_MESSAGES = 10_000
DEFAULT_MAX_ROWS = 1_000_000
DEFAULT_MAX_BYTES = 128 * 1024 * 1024
DEFAULT_MAX_SECONDS = 300.0
DEFAULT_ROW_GROUP_ROWS = 65_536
DEFAULT_MAX_OPEN_FILES = 64
DEFAULT_ZSTD_LEVEL = 3


@functools.cache
def component_schema() -> Mapping[str, Any]:
    """The `component` section's JSON Schema (a data file shipped with the package)."""
    return load_schema(SCHEMA_FILE)


def extra_installed() -> bool:
    """Whether pyarrow (the `recorder` extra) can be imported."""
    return errors.extra_installed("pyarrow")


def missing_extra() -> str:
    """The refusal naming the pip command that installs the extra."""
    return errors.missing_extra("the signal-recorder (Parquet)", "pyarrow", EXTRA)


@dataclass(frozen=True)
class RollPolicy:
    """A file is closed at whichever limit it reaches first."""

    max_rows: int = DEFAULT_MAX_ROWS
    max_bytes: int = DEFAULT_MAX_BYTES
    max_seconds: float = DEFAULT_MAX_SECONDS


@dataclass(frozen=True)
class RecorderSettings:
    include: tuple[str, ...]
    exclude: tuple[str, ...]
    #: The consumer group this recorder shares its filters with (shareGroup or
    #: consumerGroup), None for a recorder of its own.
    group: ConsumerGroupConfig | None
    queue_messages: int
    output: Path
    partition_by: tuple[str, ...]
    fsync: bool
    max_open_files: int
    roll: RollPolicy
    row_group_rows: int
    codec: str
    level: int | None
    variant: bool
    flush_on_stop: bool

    def writer_settings(self) -> tuple[Any, ...]:
        """What the open files depend on: a change closes them before it applies."""
        return (
            self.output,
            self.partition_by,
            self.fsync,
            self.roll,
            self.row_group_rows,
            self.codec,
            self.level,
            self.variant,
        )


def _group(component: Mapping[str, Any], thing: str) -> ConsumerGroupConfig | None:
    """consumerGroup as given, or shareGroup as a group of that name (this thing a member)
    that uses $share when the broker proves it delivers through it, and refuses otherwise."""
    if "consumerGroup" in component:
        return consumer_group_from_section(component["consumerGroup"], "$.component.consumerGroup")
    if "shareGroup" in component:
        return ConsumerGroupConfig(name=component["shareGroup"], member=thing, mode=GroupMode.AUTO)
    return None


def default_filter(config: ComponentConfig) -> str:
    """Every data-class topic of every instance under this configuration's root."""
    scope = config.topics
    head = scope.root if scope.root_level is None else f"{scope.root}/{scope.root_level}"
    return f"{head}/+/+/+/data/#"


def filter_problem(topic_filter: str) -> str | None:
    """Why `topic_filter` is not a valid MQTT filter, or None."""
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return "'#' must be the whole last level"
        if "+" in level and level != "+":
            return "'+' must be a whole level"
    if "\x00" in topic_filter:
        return "must not contain NUL"
    return None


def configuration_issues(config: ComponentConfig) -> list[ConfigIssue]:
    """The rules of the section a schema cannot say, each with its JSON path."""
    return list(_rules(thaw(config.component)))


def _rules(component: Mapping[str, Any]) -> Iterator[ConfigIssue]:
    if not extra_installed():
        yield ConfigIssue("$.component", missing_extra())
    topics = component.get("topics") or {}
    for key in ("include", "exclude"):
        seen: set[str] = set()
        for index, topic_filter in enumerate(topics.get(key) or []):
            path = f"$.component.topics.{key}[{index}]"
            problem = filter_problem(topic_filter)
            if problem is not None:
                yield ConfigIssue(path, problem)
            if topic_filter in seen:
                yield ConfigIssue(path, f"duplicate filter {topic_filter!r}")
            seen.add(topic_filter)
    if "consumerGroup" in component:
        try:
            consumer_group_from_section(component["consumerGroup"], "$.component.consumerGroup")
        except ConfigError as error:
            yield from error.issues
    compression = component.get("compression") or {}
    if "level" in compression and compression.get("codec", "zstd") != "zstd":
        yield ConfigIssue("$.component.compression.level", "applies to the zstd codec only")
    output = (component.get("output") or {}).get("path")
    # Created at start: a file in the way is refused here, not as a traceback there.
    if isinstance(output, str) and (problem := directory_problem(output)):
        yield ConfigIssue("$.component.output.path", f"cannot be a directory: {problem}")


def parse_component(config: ComponentConfig) -> RecorderSettings:
    """The settings of a schema-valid section; ConfigError lists every broken rule."""
    issues = configuration_issues(config)
    if issues:
        raise ConfigError(issues)
    component = thaw(config.component)
    topics = component.get("topics") or {}
    output = component["output"]
    roll = component.get("roll") or {}
    compression = component.get("compression") or {}
    codec = compression.get("codec", "zstd")
    return RecorderSettings(
        include=tuple(topics.get("include") or (default_filter(config),)),
        exclude=tuple(topics.get("exclude") or ()),
        group=_group(component, config.thing_name),
        queue_messages=(component.get("queue") or {}).get("maxMessages", DEFAULT_QUEUE_MESSAGES),
        output=Path(os.path.abspath(output["path"])),
        partition_by=tuple(output.get("partitionBy", DEFAULT_PARTITIONS)),
        fsync=output.get("fsync", True),
        max_open_files=output.get("maxOpenFiles", DEFAULT_MAX_OPEN_FILES),
        roll=RollPolicy(
            max_rows=roll.get("maxRows", DEFAULT_MAX_ROWS),
            max_bytes=roll.get("maxBytes", DEFAULT_MAX_BYTES),
            max_seconds=float(roll.get("maxSeconds", DEFAULT_MAX_SECONDS)),
        ),
        row_group_rows=component.get("rowGroupRows", DEFAULT_ROW_GROUP_ROWS),
        codec=codec,
        level=compression.get("level", DEFAULT_ZSTD_LEVEL) if codec == "zstd" else None,
        variant=component.get("valueColumns", "typed") == "variant",
        flush_on_stop=component.get("flushOnStop", True),
    )
