from collections.abc import Mapping, Sequence
from typing import Any, final

__all__ = [
    "BOOLS_PER_DWORD",
    "DWORD_CODE",
    "ELEMENTARY_TYPES",
    "REASONS",
    "Datagram",
    "Decoded",
    "ElementaryType",
    "InputPlan",
    "OutputPlan",
    "ParseResult",
    "build_datagram",
    "field_bytes",
    "parse",
]

REASONS: list[str]
ELEMENTARY_TYPES: list[ElementaryType]
DWORD_CODE: int
BOOLS_PER_DWORD: int

_FieldTuple = tuple[
    str, int, str, int | None, int | None, float | None, float | None, str, float, bool
]

@final
class ElementaryType:
    @property
    def name(self) -> str: ...
    @property
    def code(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def signed(self) -> bool: ...
    @property
    def is_float(self) -> bool: ...
    @property
    def range(self) -> tuple[int, int] | None: ...

@final
class Datagram:
    @property
    def connection_id(self) -> int: ...
    @property
    def sequence_number(self) -> int: ...
    @property
    def cip_sequence(self) -> int: ...
    @property
    def run_idle(self) -> int | None: ...
    @property
    def run(self) -> bool: ...
    @property
    def data(self) -> bytes: ...

@final
class ParseResult:
    @property
    def status(self) -> str: ...
    @property
    def datagram(self) -> Datagram | None: ...
    @property
    def consumed(self) -> int: ...
    @property
    def needed(self) -> int: ...
    @property
    def reason(self) -> str | None: ...

@final
class Decoded:
    @property
    def reason(self) -> str | None: ...
    @property
    def cip_sequence(self) -> int | None: ...
    @property
    def run(self) -> bool | None: ...
    @property
    def updates(self) -> list[tuple[int, Any]]: ...

@final
class InputPlan:
    def __new__(
        cls,
        instance: int,
        size_bytes: int,
        real_time_format: str,
        sample_ms: int,
        fields: list[_FieldTuple],
    ) -> InputPlan: ...
    @property
    def ids(self) -> list[str]: ...
    @property
    def names(self) -> list[str]: ...
    @property
    def counts(self) -> list[int]: ...
    @property
    def size_bytes(self) -> int: ...
    def reset(self) -> None: ...
    def decode(self, datagram: Any, now_ms: int) -> Decoded: ...
    def decode_batch(
        self, datagrams: Sequence[Any], now_ms: int | Sequence[int]
    ) -> tuple[bytes, bytes, bytes, bytes]: ...

@final
class OutputPlan:
    def __new__(
        cls,
        instance: int,
        size_bytes: int,
        real_time_format: str,
        fields: list[_FieldTuple],
    ) -> OutputPlan: ...
    @property
    def ids(self) -> list[str]: ...
    @property
    def names(self) -> list[str]: ...
    @property
    def size_bytes(self) -> int: ...
    @property
    def real_time_format(self) -> str: ...
    def encode(self, values: Mapping[str, Any], base: Any | None = None) -> bytes: ...

def field_bytes(type_name: str, array_count: int | None = None, bit: bool = False) -> int: ...
def parse(data: Any, real_time_format: str, size: int | None = None) -> ParseResult: ...
def build_datagram(
    connection_id: int,
    sequence_number: int,
    cip_sequence: int,
    real_time_format: str,
    run: bool = True,
    data: Any | None = None,
) -> bytes: ...
