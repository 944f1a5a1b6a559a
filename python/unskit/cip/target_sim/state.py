"""The sim's data: assembly specs and images, class-1 connections, encapsulation sessions, and
the attributes the sim's parts share (see `unskit.cip.target_sim.sim`)."""

from __future__ import annotations

import dataclasses
import logging
import selectors
import socket
import threading
from dataclasses import dataclass, field

from unskit.cip.target_sim.wire import FORMATS, Format
from unskit.errors import CipError

_log = logging.getLogger("unskit.cip.target_sim.sim")  # one logger, named as before the split

#: Distinct O->T images an assembly remembers for `outputs_seen`.
_SEEN = 10_000


@dataclass(frozen=True)
class AssemblySpec:
    """One assembly instance: its data size in bytes and, optionally, its real-time format."""

    size: int
    #: None: header32 when the assembly is an O->T connection point, modeless when T->O.
    format: Format | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.size <= 65_000:
            raise CipError(f"assembly size {self.size} is not within 0..65000")
        if self.format is not None and self.format not in FORMATS:
            raise CipError(f"assembly format {self.format!r} is not one of {', '.join(FORMATS)}")


@dataclass(frozen=True)
class ConnectionInfo:
    """A snapshot of one class-1 connection the sim opened."""

    o2t_id: int
    t2o_id: int
    #: (connection serial number, originator vendor id, originator serial number)
    triad: tuple[int, int, int]
    output_instance: int
    input_instance: int
    config_instance: int | None
    o2t_rpi_us: int
    t2o_rpi_us: int
    o2t_api_us: int
    t2o_api_us: int
    #: Connection sizes as the network parameters give them (headers included).
    o2t_size: int
    t2o_size: int
    o2t_format: str
    t2o_format: str
    timeout_multiplier: int
    multicast: bool
    #: Where T->O datagrams go.
    t2o_destination: tuple[str, int]
    large: bool
    #: "open", "closed" (Forward Close) or "timed_out" (O->T silent beyond its timeout).
    state: str
    produced: int
    consumed: int
    #: Last O->T encapsulation sequence number and CIP sequence count, None before any.
    o2t_sequence: int | None
    o2t_sequence_count: int | None
    #: O->T datagrams not applied, by reason (wrong_size, stale).
    dropped: dict[str, int]


@dataclass
class _Assembly:
    spec: AssemblySpec
    data: bytearray
    sequence_count: int = 0
    run: bool | None = None
    written: bool = False
    #: Every distinct O->T image consumed, in order (bounded), for atomicity checks.
    seen: list[bytes] = field(default_factory=list)


@dataclass
class _Connection:
    o2t_id: int
    t2o_id: int
    triad: tuple[int, int, int]
    output_instance: int
    input_instance: int
    config_instance: int | None
    o2t_rpi_us: int
    t2o_rpi_us: int
    o2t_api_us: int
    t2o_api_us: int
    o2t_size: int
    t2o_size: int
    o2t_format: str
    t2o_format: str
    timeout_multiplier: int
    multicast: bool
    t2o_destination: tuple[str, int]
    large: bool
    next_due: float
    last_heard: float
    state: str = "open"
    produced: int = 0
    consumed: int = 0
    t2o_sequence: int = 0
    o2t_sequence: int | None = None
    o2t_sequence_count: int | None = None
    dropped: dict[str, int] = field(default_factory=dict)

    def timeout_s(self) -> float:
        return self.timeout_multiplier * self.o2t_api_us / 1e6

    def info(self) -> ConnectionInfo:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(ConnectionInfo)}
        fields["dropped"] = dict(self.dropped)
        return ConnectionInfo(**fields)


@dataclass
class _Session:
    sock: socket.socket
    peer: str
    buffer: bytearray = field(default_factory=bytearray)
    handle: int = 0


class _SimState:
    """What the sim's parts share; `CipTargetSim.__init__` sets every attribute."""

    host: str
    tcp_port: int
    udp_port: int
    min_rpi_ms: float
    api_override_us: int | None
    refuse: int | None
    multicast_group: str
    unmatched: int
    malformed: int
    _assemblies: dict[int, _Assembly]
    _lock: threading.Lock
    _changed: threading.Condition
    _connections: list[_Connection]
    _by_o2t: dict[int, _Connection]
    _sessions: dict[int, _Session]
    _next_session: int
    _next_id: int
    _echo: list[tuple[int, int, int]]
    _producing: bool
    _wrong_size: int
    _duplicate: int
    _reorder: int
    _animated: dict[int, float]
    _pattern_period: float
    _pattern_due: float
    _pattern_tick: int
    _pattern_start: float
    _udp: socket.socket | None
    _selector: selectors.DefaultSelector | None
