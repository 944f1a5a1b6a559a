from collections.abc import Mapping, Sequence
from typing import Any, final

from unskit._core.signal import Buffer

__all__ = [
    "BOOLS_PER_DWORD",
    "DROP_REASONS",
    "DWORD_CODE",
    "ELEMENTARY_TYPES",
    "REASONS",
    "Datagram",
    "Decoded",
    "ElementaryType",
    "ForwardOpenOutcome",
    "InputPlan",
    "IoBatch",
    "IoEngine",
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
#: Per-connection drop counters: the frame REASONS, then duplicate, stale, wrong_source,
#: queue_full (counted per sample) and timed_out (datagrams after the watchdog expired).
DROP_REASONS: list[str]
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
    @property
    def elements(self) -> int: ...
    @property
    def starts(self) -> list[int]: ...
    def decode_columns(
        self, datagrams: Any, now_ms: int | Sequence[int]
    ) -> tuple[Buffer, Buffer, Buffer]: ...

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

@final
class IoBatch:
    """Samples and watchdog expiries since the last poll, as columns (row i of each list is
    one sample): key, signal id, value as InputPlan.decode gives it, ts_ms since the epoch,
    run bit of the datagram (None for modeless)."""

    @property
    def keys(self) -> list[int]: ...
    @property
    def ids(self) -> list[str]: ...
    @property
    def values(self) -> list[Any]: ...
    @property
    def ts_ms(self) -> list[int]: ...
    @property
    def runs(self) -> list[bool | None]: ...
    @property
    def samples(self) -> list[tuple[int, str, Any, int, bool | None]]:
        """The same as rows (key, id, value, ts_ms, run): a convenience, built on access."""
    @property
    def timed_out(self) -> list[int]:
        """Keys whose watchdog expired since the last poll (each reported once)."""
    def __len__(self) -> int: ...

@final
class IoEngine:
    """Class-1 implicit I/O: one UDP socket and one thread off the GIL.

    Every method taking a key raises CipError for a key that is not open (and `open` for
    one that is: close it first, also after a watchdog timeout). Socket failures (bind,
    multicast join) raise OSError. The first O-to-T datagram carries sequence number 1
    and CIP sequence count 1; the sequence number counts every datagram, the CIP count
    every change of image or run bit. A connection's first good datagram publishes every
    field (the engine keeps its own reset copy of the input plan), later ones what the
    plan's gate lets through.
    """

    def __new__(
        cls,
        bind_host: str = "0.0.0.0",
        port: int = 2222,
        queue_capacity: int = ...,
        multicast_interface: str = "127.0.0.1",
    ) -> IoEngine: ...
    @property
    def port(self) -> int: ...
    def open(
        self,
        key: int,
        *,
        t2o_connection_id: int,
        o2t_connection_id: int,
        target_host: str,
        target_port: int,
        t2o_api_us: int,
        o2t_api_us: int,
        timeout_multiplier: int,
        input_plan: InputPlan,
        output_format: str,
        output_image: bytes,
        run: bool = True,
        multicast_group: str | None = None,
    ) -> None: ...
    def close(self, key: int) -> None: ...
    def set_output(self, key: int, image: bytes, run: bool | None = None) -> None: ...
    def poll(self, timeout_s: float, max_samples: int = 65536) -> IoBatch: ...
    def read(self, key: int) -> list[tuple[str, Any]] | None: ...
    def stats(self, key: int) -> dict[str, Any]:
        """state ("open" or "timed_out"), both connection ids and APIs, last_sequence,
        last_cip_sequence, run, datagrams_received (every datagram with this connection's
        id, dropped ones included), datagrams_produced, o2t_sequence, o2t_cip_sequence,
        drops (a dict keyed by DROP_REASONS), watchdog_timeouts, send_errors,
        lateness_p50_us / lateness_p99_us / lateness_max_us (None before the first)."""
    def global_stats(self) -> dict[str, Any]:
        """datagrams_received (all), unknown_connection, malformed (per frame reason, for
        datagrams whose connection id cannot be read), recv_errors, queued,
        queue_capacity."""
    def shutdown(self) -> None: ...
