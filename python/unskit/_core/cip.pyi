from collections.abc import Mapping, Sequence
from typing import Any, final

__all__ = [
    "BOOLS_PER_DWORD",
    "DROP_REASONS",
    "DWORD_CODE",
    "ELEMENTARY_TYPES",
    "REASONS",
    "Datagram",
    "Decoded",
    "ElementaryType",
    "InputPlan",
    "IoBatch",
    "IoEngine",
    "OutputPlan",
    "ParseResult",
    "build_datagram",
    "field_bytes",
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

@final
class IoBatch:
    """Samples and watchdog expiries since the last poll."""

    @property
    def samples(self) -> list[tuple[int, str, Any, int, bool | None]]:
        """(key, signal id, value as InputPlan.decode gives it, ts_ms since the epoch, run
        bit of the datagram or None for modeless)."""
    @property
    def timed_out(self) -> list[int]:
        """Keys whose watchdog expired since the last poll (each reported once)."""

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

    def __init__(
        self,
        bind_host: str = "0.0.0.0",
        port: int = 2222,
        queue_capacity: int = 100_000,
        multicast_interface: str = "127.0.0.1",
    ) -> None: ...
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
