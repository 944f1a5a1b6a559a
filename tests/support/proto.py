"""Classes the official protobuf runtime builds from proto/unskit/v1/envelope.proto.

They are the independent oracle for our Rust codec (and the benchmarks' anchor). protoc
compiles the .proto to a descriptor set; protobuf's message factory turns it into classes,
so no generated code of one protoc version meets a runtime of another.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "proto"
ENVELOPE_PROTO = "unskit/v1/envelope.proto"
MESSAGES = (
    "Envelope",
    "Header",
    "Identity",
    "Value",
    "ListValue",
    "MapValue",
    "SouthboundSignalUpdate",
    "Signal",
    "Sample",
)


def protoc() -> str:
    """The protoc binary; its absence is a failure, never a skip (make test installs it)."""
    path = shutil.which("protoc")
    if path is None:
        raise RuntimeError("protoc is not installed: run `make test` (scripts/install-system-deps)")
    return path


@functools.cache
def _descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "envelope.desc"
        subprocess.run(
            [
                protoc(),
                f"-I{PROTO_DIR}",
                "--include_imports",
                f"--descriptor_set_out={out}",
                ENVELOPE_PROTO,
            ],
            check=True,
        )
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def _classes(files: descriptor_pb2.FileDescriptorSet) -> Any:
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    return SimpleNamespace(
        **{
            name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"unskit.v1.{name}"))
            for name in MESSAGES
        }
    )


@functools.cache
def envelope_classes() -> Any:
    """A namespace of protobuf message classes (upb runtime) for every envelope message."""
    return _classes(_descriptor_set())


@functools.cache
def envelope_classes_before_sample_status() -> Any:
    """The same classes as the schema was before `Sample.status` (tag 5): an older peer."""
    files = descriptor_pb2.FileDescriptorSet()
    files.CopyFrom(_descriptor_set())
    for file in files.file:
        for message in file.message_type:
            if message.name == "Sample":
                kept = [f for f in message.field if f.name != "status"]
                assert len(kept) == len(message.field) - 1, "Sample.status is not in the schema"
                del message.field[:]
                message.field.extend(kept)
    return _classes(files)


def value_from_python(classes: Any, obj: Any) -> Any:
    """The protobuf `Value` the builder makes from a Python object (the anchor's work)."""
    value = classes.Value()
    if obj is None:
        value.null_value = 0
    elif isinstance(obj, bool):
        value.bool_value = obj
    elif isinstance(obj, int) and obj > 2**63 - 1:
        value.uint_value = obj  # the schema's kind for 2^63..2^64-1
    elif isinstance(obj, int):
        value.int_value = obj
    elif isinstance(obj, float):
        value.double_value = obj
    elif isinstance(obj, str):
        value.string_value = obj
    elif isinstance(obj, bytes):
        value.bytes_value = obj
    elif isinstance(obj, dict):
        value.map_value.SetInParent()  # an empty dict is still a map
        fields = value.map_value.fields
        for key, item in obj.items():
            fields[key].CopyFrom(value_from_python(classes, item))
    elif isinstance(obj, list | tuple):
        value.list_value.SetInParent()  # an empty list is still a list
        values = value.list_value.values
        for item in obj:
            values.append(value_from_python(classes, item))
    else:
        raise TypeError(type(obj).__name__)
    return value
