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
    "ForwardOpenOutcome",
    "InputPlan",
    "OutputPlan",
    "ParseResult",
    "build_datagram",
    "connection_status",
    "decode_forward_close_reply",
    "decode_forward_open_reply",
    "field_bytes",
    "forward_close_request",
    "forward_open_request",
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

# -- cip::connection: Forward Open / Forward Close (Message Router bytes) --------------------

@final
class ForwardOpenOutcome:
    @property
    def opened(self) -> bool: ...
    @property
    def large(self) -> bool: ...
    @property
    def o2t_connection_id(self) -> int: ...
    @property
    def t2o_connection_id(self) -> int: ...
    @property
    def connection_serial(self) -> int: ...
    @property
    def o2t_api_us(self) -> int: ...
    @property
    def t2o_api_us(self) -> int: ...
    @property
    def general_status(self) -> int: ...
    @property
    def extended_status(self) -> int | None: ...
    @property
    def status(self) -> str: ...

def forward_open_request(
    *,
    o2t_connection_id: int,
    t2o_connection_id: int,
    connection_serial: int,
    vendor_id: int,
    originator_serial: int,
    timeout_multiplier: int,
    o2t_rpi_us: int,
    t2o_rpi_us: int,
    o2t_size: int,
    t2o_size: int,
    config: int,
    output: int,
    input: int,
    t2o_type: str = "p2p",
    priority: str = "scheduled",
) -> bytes: ...
def forward_close_request(
    *,
    connection_serial: int,
    vendor_id: int,
    originator_serial: int,
    config: int,
    output: int,
    input: int,
) -> bytes: ...
def decode_forward_open_reply(data: bytes) -> ForwardOpenOutcome: ...
def decode_forward_close_reply(data: bytes) -> str | None: ...
def connection_status(general: int, extended: int | None = None) -> str: ...
