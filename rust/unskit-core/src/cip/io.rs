//! Class-1 implicit I/O off the interpreter: one UDP socket and one thread
//! ("unskit-cip-io") receive every T-to-O datagram and produce every O-to-T datagram.
//!
//! Everything a datagram does goes through [`Dispatcher`], which owns no socket and no
//! clock (the caller passes both times in), so it is unit-tested and fuzzed alone. The
//! thread sleeps in `ppoll` on the socket and an eventfd until the next deadline (an O-to-T
//! production or a watchdog); open, close, set_output and shutdown write the eventfd to
//! wake it at once. Decoded samples go into one bounded queue that [`IoEngine::poll`]
//! drains.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use socket2::{Domain, Protocol, Socket, Type};

use crate::cip::frame::{self, Parse, RealTimeFormat, Reason};
use crate::cip::plan::{Field, InputPlan, Sink, Value};
use crate::error::CoreError;

pub const DEFAULT_QUEUE_CAPACITY: usize = 100_000;
/// SO_RCVBUF asked for (the kernel caps it at net.core.rmem_max).
pub const RECV_BUFFER_BYTES: usize = 4 << 20;
/// Productions whose lateness the percentiles cover.
const LATENESS_WINDOW: usize = 1024;
/// Datagrams received in one go (one recvmmsg call) before the thread looks at its commands.
const RECV_BATCH: usize = 256;
/// The receive slot of a datagram when no connection accepts longer ones; longer
/// datagrams are cut to their slot and dropped as whole ones would be (see `on_received`).
const MIN_SLOT_BYTES: usize = 2048;
/// What all receive slots together may take (fewer slots when a connection's datagrams
/// need larger ones).
const BATCH_BYTES: usize = RECV_BATCH * MIN_SLOT_BYTES;
/// The receive buffer of the one-datagram path this replaced: nothing longer was seen.
const MAX_DATAGRAM: usize = 65536;

/// Every drop counter of a connection: the frame reasons, then the engine's own.
pub const DROP_REASONS: [&str; 13] = [
    "truncated",
    "item_count",
    "address_item",
    "address_length",
    "data_item",
    "data_length",
    "trailing_bytes",
    "wrong_size",
    "duplicate",
    "stale",
    "wrong_source",
    "queue_full",
    "timed_out",
];

/// Why a datagram of a known connection, or one of its samples, was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    Frame(Reason),
    /// The same 32-bit sequence number as the last good datagram.
    Duplicate,
    /// An older sequence number (serial arithmetic) than the last good datagram.
    Stale,
    /// From another IP address than the connection's target.
    WrongSource,
    /// A sample the full queue had no room for (counted per sample).
    QueueFull,
    /// A datagram for a connection whose watchdog expired (it waits to be closed).
    TimedOut,
}

impl DropReason {
    fn index(self) -> usize {
        match self {
            DropReason::Frame(r) => Reason::ALL.iter().position(|x| *x == r).unwrap_or(0),
            DropReason::Duplicate => 8,
            DropReason::Stale => 9,
            DropReason::WrongSource => 10,
            DropReason::QueueFull => 11,
            DropReason::TimedOut => 12,
        }
    }

    pub fn name(self) -> &'static str {
        DROP_REASONS[self.index()]
    }
}

/// What the caller states to open one connection (after its Forward Open succeeded).
#[derive(Debug, Clone)]
pub struct ConnectionSetup {
    pub t2o_connection_id: u32,
    pub o2t_connection_id: u32,
    /// Where O-to-T datagrams go.
    pub target: SocketAddr,
    /// The only IP address T-to-O datagrams of this connection are accepted from.
    pub source: IpAddr,
    pub t2o_api_us: u32,
    pub o2t_api_us: u32,
    /// The watchdog fires after `timeout_multiplier * t2o_api_us` without a good datagram.
    pub timeout_multiplier: u32,
    /// Decodes the T-to-O assembly (its format and size are the connection's).
    pub input: InputPlan,
    pub output_format: RealTimeFormat,
    /// The O-to-T assembly (empty for a heartbeat); its length is fixed from here on.
    pub output_image: Vec<u8>,
    pub run: bool,
    /// A multicast T-to-O group to join.
    pub multicast_group: Option<Ipv4Addr>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionState {
    Open,
    TimedOut,
}

impl ConnectionState {
    pub fn name(self) -> &'static str {
        match self {
            ConnectionState::Open => "open",
            ConnectionState::TimedOut => "timed_out",
        }
    }
}

/// One published field of one good datagram.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub key: u64,
    pub signal: Arc<str>,
    pub value: Value,
    /// Wall-clock receive time, ms since the epoch.
    pub ts_ms: u64,
    /// The datagram's run/idle bit; None for a modeless assembly.
    pub run: Option<bool>,
}

/// A [`Sample`] as the queue holds it: its signal id by index into the dispatcher's
/// [`SignalNames`]. The I/O thread then never touches a reference count the consumer
/// drops on another core (that shared cache line was a tenth of its decode time).
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedSample {
    pub key: u64,
    pub signal: u32,
    pub value: Value,
    pub ts_ms: u64,
    pub run: Option<bool>,
}

impl QueuedSample {
    fn named(self, names: &[Arc<str>]) -> Sample {
        Sample {
            key: self.key,
            signal: names[self.signal as usize].clone(),
            value: self.value,
            ts_ms: self.ts_ms,
            run: self.run,
        }
    }
}

/// Every signal id connections have used, by the index samples carry; it only grows
/// (by the distinct ids of the plans opened), so an index stays valid after a close.
pub type SignalNames = Arc<Vec<Arc<str>>>;

/// What [`IoEngine::poll_queued`] hands over.
#[derive(Debug, Clone)]
pub struct Polled {
    pub samples: Vec<QueuedSample>,
    /// Names every sample's signal index (and possibly more).
    pub names: SignalNames,
    pub timed_out: Vec<u64>,
}

/// One field of [`Dispatcher::read`]: its signal id and value.
pub type Reading = (Arc<str>, Value);

/// What one datagram did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Good: `samples` fields were queued.
    Accepted {
        key: u64,
        samples: usize,
    },
    Dropped {
        key: u64,
        reason: DropReason,
    },
    /// A connection id no open connection has.
    UnknownConnection,
    /// Too malformed to tell its connection id.
    Malformed(Reason),
}

/// One O-to-T datagram due, to send outside the lock.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub key: u64,
    pub target: SocketAddr,
    pub deadline: Instant,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ConnectionStats {
    pub state: ConnectionState,
    pub t2o_connection_id: u32,
    pub o2t_connection_id: u32,
    pub t2o_api_us: u32,
    pub o2t_api_us: u32,
    pub last_sequence: Option<u32>,
    pub last_cip_sequence: Option<u16>,
    /// The last good datagram's run/idle bit; None for modeless (or before the first).
    pub run: Option<bool>,
    /// Every datagram carrying this connection's id, dropped ones included.
    pub datagrams_received: u64,
    pub datagrams_produced: u64,
    /// The O-to-T sequence number and CIP sequence count of the last production.
    pub o2t_sequence: u32,
    pub o2t_cip_sequence: u16,
    /// Counter per name of [`DROP_REASONS`], in that order.
    pub drops: Vec<(&'static str, u64)>,
    pub watchdog_timeouts: u64,
    pub send_errors: u64,
    /// Production lateness over the last productions (send time minus deadline).
    pub lateness_p50_us: Option<u64>,
    pub lateness_p99_us: Option<u64>,
    pub lateness_max_us: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GlobalStats {
    pub datagrams_received: u64,
    pub unknown_connection: u64,
    /// Datagrams too malformed to tell their connection, per frame reason.
    pub malformed: Vec<(&'static str, u64)>,
    pub recv_errors: u64,
    pub queued: usize,
    pub queue_capacity: usize,
}

struct Connection {
    setup: ConnectionSetup,
    fields: Vec<Field>,
    /// The fields' signal ids, as indices into the dispatcher's names.
    ids: Vec<u32>,
    watchdog: Duration,
    o2t_api: Duration,
    state: ConnectionState,
    watchdog_deadline: Instant,
    last_sequence: Option<u32>,
    last_cip_sequence: Option<u16>,
    last_run: Option<bool>,
    /// The last good T-to-O assembly data.
    image: Option<Vec<u8>>,
    next_send: Instant,
    o2t_sequence: u32,
    o2t_cip_sequence: u16,
    received: u64,
    produced: u64,
    drops: [u64; DROP_REASONS.len()],
    watchdog_timeouts: u64,
    send_errors: u64,
    lateness_us: VecDeque<u64>,
}

/// Queues every field the plan publishes, as long as the queue has room.
struct Enqueue<'a> {
    queue: &'a mut VecDeque<QueuedSample>,
    capacity: usize,
    key: u64,
    fields: &'a [Field],
    ids: &'a [u32],
    data: &'a [u8],
    ts_ms: u64,
    run: Option<bool>,
    queued: usize,
    full: u64,
}

impl Sink for Enqueue<'_> {
    fn publish(&mut self, field: usize, values: &[f64]) -> bool {
        if self.queue.len() >= self.capacity {
            self.full += 1;
            return false;
        }
        self.queue.push_back(QueuedSample {
            key: self.key,
            signal: self.ids[field],
            value: self.fields[field].value(self.data, values),
            ts_ms: self.ts_ms,
            run: self.run,
        });
        self.queued += 1;
        true
    }
}

/// The connection id of a datagram, or why it cannot be read.
fn connection_id_of(bytes: &[u8]) -> Result<u32, Reason> {
    match frame::parse(bytes, RealTimeFormat::Modeless) {
        Parse::Complete { value, .. } => Ok(value.connection_id),
        Parse::Malformed(r @ (Reason::ItemCount | Reason::AddressItem | Reason::AddressLength)) => {
            Err(r)
        }
        // The address item is whole: the id is there even if the data item is not.
        _ if bytes.len() >= 10 && bytes[..2] == [2, 0] => {
            Ok(u32::from_le_bytes([bytes[6], bytes[7], bytes[8], bytes[9]]))
        }
        Parse::Malformed(r) => Err(r),
        _ => Err(Reason::Truncated),
    }
}

fn micros(us: u32) -> Duration {
    Duration::from_micros(u64::from(us))
}

/// Every connection and the sample queue; no socket, no clock.
pub struct Dispatcher {
    epoch: Instant,
    connections: HashMap<u64, Connection>,
    by_t2o: HashMap<u32, u64>,
    groups: HashMap<Ipv4Addr, usize>,
    queue: VecDeque<QueuedSample>,
    names: SignalNames,
    name_index: HashMap<Arc<str>, u32>,
    capacity: usize,
    timeouts: Vec<u64>,
    earliest: Option<Instant>,
    received: u64,
    unknown: u64,
    malformed: [u64; Reason::ALL.len()],
    recv_errors: u64,
    /// The longest T-to-O datagram any open connection accepts.
    largest: usize,
    /// A cut datagram made whole again (its length, zeros past the cut).
    scratch: Vec<u8>,
}

impl Dispatcher {
    /// `epoch` starts the monotonic milliseconds the plans' sampleMs gates count.
    pub fn new(queue_capacity: usize, epoch: Instant) -> Self {
        Dispatcher {
            epoch,
            connections: HashMap::new(),
            by_t2o: HashMap::new(),
            groups: HashMap::new(),
            queue: VecDeque::new(),
            names: Arc::new(Vec::new()),
            name_index: HashMap::new(),
            capacity: queue_capacity,
            timeouts: Vec::new(),
            earliest: None,
            received: 0,
            unknown: 0,
            malformed: [0; Reason::ALL.len()],
            recv_errors: 0,
            largest: 0,
            scratch: Vec::new(),
        }
    }

    /// Every signal id by the index samples carry.
    pub fn names(&self) -> SignalNames {
        self.names.clone()
    }

    fn intern(&mut self, id: &str) -> u32 {
        if let Some(index) = self.name_index.get(id) {
            return *index;
        }
        let index = self.names.len() as u32;
        let name: Arc<str> = Arc::from(id);
        // Copies the list only while a consumer still holds the previous one.
        Arc::make_mut(&mut self.names).push(name.clone());
        self.name_index.insert(name, index);
        index
    }

    /// The longest T-to-O datagram an open connection accepts (0 with none open).
    pub fn largest_datagram(&self) -> usize {
        self.largest
    }

    fn find_largest(&mut self) {
        self.largest = self
            .connections
            .values()
            .map(|c| c.setup.input.format.datagram_bytes(c.setup.input.size))
            .max()
            .unwrap_or(0);
    }

    /// Connections using `group` now.
    pub fn group_users(&self, group: Ipv4Addr) -> usize {
        self.groups.get(&group).copied().unwrap_or(0)
    }

    /// Starts a connection: production from `now`, the watchdog from `now`.
    pub fn open(
        &mut self,
        key: u64,
        setup: ConnectionSetup,
        now: Instant,
    ) -> Result<(), CoreError> {
        let bad = |rule: String| Err(CoreError::InvalidCip(format!("connection {key}: {rule}")));
        if self.connections.contains_key(&key) {
            return bad("already open (close it first)".into());
        }
        if let Some(other) = self.by_t2o.get(&setup.t2o_connection_id) {
            return bad(format!(
                "T-to-O connection id {:#010x} is already used by connection {other}",
                setup.t2o_connection_id
            ));
        }
        if setup.t2o_api_us == 0 || setup.o2t_api_us == 0 {
            return bad("both APIs must be at least 1 us".into());
        }
        if setup.timeout_multiplier == 0 {
            return bad("timeout_multiplier must be at least 1".into());
        }
        if let Some(group) = setup.multicast_group {
            if !group.is_multicast() {
                return bad(format!("{group} is not a multicast group"));
            }
        }
        let mut trial = Vec::new();
        frame::build(
            &mut trial,
            setup.o2t_connection_id,
            0,
            0,
            setup.output_format,
            setup.run,
            &setup.output_image,
        )
        .map_err(|e| CoreError::InvalidCip(format!("connection {key}: output: {e}")))?;
        let fields = setup.input.fields().to_vec();
        let ids = fields.iter().map(|f| self.intern(&f.id)).collect();
        let watchdog = micros(setup.t2o_api_us).saturating_mul(setup.timeout_multiplier);
        let o2t_api = micros(setup.o2t_api_us);
        if let Some(group) = setup.multicast_group {
            *self.groups.entry(group).or_insert(0) += 1;
        }
        self.by_t2o.insert(setup.t2o_connection_id, key);
        self.connections.insert(
            key,
            Connection {
                setup,
                fields,
                ids,
                watchdog,
                o2t_api,
                state: ConnectionState::Open,
                watchdog_deadline: now + watchdog,
                last_sequence: None,
                last_cip_sequence: None,
                last_run: None,
                image: None,
                next_send: now,
                o2t_sequence: 0,
                o2t_cip_sequence: 1,
                received: 0,
                produced: 0,
                drops: [0; DROP_REASONS.len()],
                watchdog_timeouts: 0,
                send_errors: 0,
                lateness_us: VecDeque::with_capacity(LATENESS_WINDOW),
            },
        );
        self.earliest = Some(self.earliest.map_or(now, |e| e.min(now)));
        self.find_largest();
        Ok(())
    }

    fn unknown_key(key: u64) -> CoreError {
        CoreError::InvalidCip(format!("no connection {key}"))
    }

    /// Forgets a connection and its pending timeout event; answers the multicast group
    /// that no connection uses any more (to leave).
    pub fn close(&mut self, key: u64) -> Result<Option<Ipv4Addr>, CoreError> {
        let conn = self
            .connections
            .remove(&key)
            .ok_or_else(|| Self::unknown_key(key))?;
        self.by_t2o.remove(&conn.setup.t2o_connection_id);
        self.timeouts.retain(|k| *k != key);
        self.find_largest();
        let Some(group) = conn.setup.multicast_group else {
            return Ok(None);
        };
        let users = self.groups.entry(group).or_insert(1);
        *users -= 1;
        if *users == 0 {
            self.groups.remove(&group);
            return Ok(Some(group));
        }
        Ok(None)
    }

    /// Replaces the whole O-to-T image (and the run bit when given); a change of either
    /// counts the CIP sequence count up.
    pub fn set_output(
        &mut self,
        key: u64,
        image: Vec<u8>,
        run: Option<bool>,
    ) -> Result<(), CoreError> {
        let conn = self
            .connections
            .get_mut(&key)
            .ok_or_else(|| Self::unknown_key(key))?;
        if image.len() != conn.setup.output_image.len() {
            return Err(CoreError::InvalidCip(format!(
                "connection {key}: the output image is {} bytes, got {}",
                conn.setup.output_image.len(),
                image.len()
            )));
        }
        let run = run.unwrap_or(conn.setup.run);
        if image != conn.setup.output_image || run != conn.setup.run {
            conn.setup.output_image = image;
            conn.setup.run = run;
            conn.o2t_cip_sequence = conn.o2t_cip_sequence.wrapping_add(1);
        }
        Ok(())
    }

    /// One received datagram. Never panics, whatever the bytes.
    pub fn on_datagram(
        &mut self,
        src: SocketAddr,
        bytes: &[u8],
        now: Instant,
        wall_ms: u64,
    ) -> Outcome {
        self.dispatch(src, bytes, true, now, wall_ms)
    }

    /// A datagram `len` bytes long of which `head` was received (a receive slot cuts a
    /// longer one). A cut one counts as the whole one would: past the item headers its
    /// length alone decides its drop reason, so zeros stand in for the missing bytes; one
    /// that would still be accepted (a connection opened for longer datagrams after the
    /// slots were sized) is dropped as truncated, its data being incomplete.
    pub fn on_received(
        &mut self,
        src: SocketAddr,
        head: &[u8],
        len: usize,
        now: Instant,
        wall_ms: u64,
    ) -> Outcome {
        let len = len.min(MAX_DATAGRAM);
        if len <= head.len() {
            return self.dispatch(src, &head[..len], true, now, wall_ms);
        }
        let mut whole = std::mem::take(&mut self.scratch);
        whole.clear();
        whole.extend_from_slice(head);
        whole.resize(len, 0);
        let outcome = self.dispatch(src, &whole, false, now, wall_ms);
        self.scratch = whole;
        outcome
    }

    fn dispatch(
        &mut self,
        src: SocketAddr,
        bytes: &[u8],
        complete: bool,
        now: Instant,
        wall_ms: u64,
    ) -> Outcome {
        self.received += 1;
        let id = match connection_id_of(bytes) {
            Ok(id) => id,
            Err(reason) => {
                self.malformed[DropReason::Frame(reason).index()] += 1;
                return Outcome::Malformed(reason);
            }
        };
        let Some((key, conn)) = self
            .by_t2o
            .get(&id)
            .and_then(|&key| Some((key, self.connections.get_mut(&key)?)))
        else {
            self.unknown += 1;
            return Outcome::UnknownConnection;
        };
        conn.received += 1;
        let dropped = |conn: &mut Connection, reason: DropReason| {
            conn.drops[reason.index()] += 1;
            Outcome::Dropped { key, reason }
        };
        if src.ip().to_canonical() != conn.setup.source.to_canonical() {
            return dropped(conn, DropReason::WrongSource);
        }
        if conn.state == ConnectionState::TimedOut {
            return dropped(conn, DropReason::TimedOut);
        }
        let format = conn.setup.input.format;
        let d = match frame::parse_datagram(bytes, format, conn.setup.input.size) {
            Ok(_) if !complete => return dropped(conn, DropReason::Frame(Reason::Truncated)),
            Ok(d) => d,
            Err(reason) => return dropped(conn, DropReason::Frame(reason)),
        };
        if let Some(last) = conn.last_sequence {
            // Serial arithmetic: ahead by less than half the number space is newer.
            let ahead = d.sequence_number.wrapping_sub(last) as i32;
            if ahead == 0 {
                return dropped(conn, DropReason::Duplicate);
            }
            if ahead < 0 {
                return dropped(conn, DropReason::Stale);
            }
        }
        let run = (format == RealTimeFormat::Header32).then(|| d.run());
        conn.last_sequence = Some(d.sequence_number);
        conn.last_cip_sequence = Some(d.cip_sequence);
        conn.last_run = run;
        conn.watchdog_deadline = now + conn.watchdog;
        match &mut conn.image {
            Some(image) => image.copy_from_slice(d.data),
            None => conn.image = Some(d.data.to_vec()),
        }
        let gate_ms = now.saturating_duration_since(self.epoch).as_millis() as u64;
        let mut sink = Enqueue {
            queue: &mut self.queue,
            capacity: self.capacity,
            key,
            fields: &conn.fields,
            ids: &conn.ids,
            data: d.data,
            ts_ms: wall_ms,
            run,
            queued: 0,
            full: 0,
        };
        conn.setup.input.decode_data(d.data, gate_ms, &mut sink);
        let (samples, full) = (sink.queued, sink.full);
        conn.drops[DropReason::QueueFull.index()] += full;
        Outcome::Accepted { key, samples }
    }

    /// The earliest production or watchdog deadline (a lower bound: calling
    /// [`Dispatcher::on_time`] early is harmless).
    pub fn earliest(&self) -> Option<Instant> {
        self.earliest
    }

    /// Expires watchdogs and builds every O-to-T datagram due at `now` into `out`.
    pub fn on_time(&mut self, now: Instant, out: &mut Vec<Outgoing>) {
        let mut earliest: Option<Instant> = None;
        for (&key, conn) in self.connections.iter_mut() {
            if conn.state != ConnectionState::Open {
                continue;
            }
            if now >= conn.watchdog_deadline {
                conn.state = ConnectionState::TimedOut;
                conn.watchdog_timeouts += 1;
                self.timeouts.push(key);
                continue;
            }
            if now >= conn.next_send {
                conn.o2t_sequence = conn.o2t_sequence.wrapping_add(1);
                let mut bytes = Vec::new();
                // open() checked that this output builds.
                let built = frame::build(
                    &mut bytes,
                    conn.setup.o2t_connection_id,
                    conn.o2t_sequence,
                    conn.o2t_cip_sequence,
                    conn.setup.output_format,
                    conn.setup.run,
                    &conn.setup.output_image,
                );
                if built.is_ok() {
                    out.push(Outgoing {
                        key,
                        target: conn.setup.target,
                        deadline: conn.next_send,
                        bytes,
                    });
                    conn.produced += 1;
                }
                // Absolute deadlines: the next period, or the first one after `now` when
                // more than a period late (skipped periods are not made up).
                conn.next_send += conn.o2t_api;
                if conn.next_send <= now {
                    let api = conn.o2t_api.as_nanos().max(1);
                    let behind = (now - conn.next_send).as_nanos();
                    let skip = (behind / api + 1) * api;
                    conn.next_send += Duration::from_nanos(u64::try_from(skip).unwrap_or(u64::MAX));
                }
            }
            let next = conn.next_send.min(conn.watchdog_deadline);
            earliest = Some(earliest.map_or(next, |e| e.min(next)));
        }
        self.earliest = earliest;
    }

    /// Records the fate of an [`Outgoing`] sent at `at`.
    pub fn sent(&mut self, key: u64, deadline: Instant, at: Instant, ok: bool) {
        if let Some(conn) = self.connections.get_mut(&key) {
            if !ok {
                conn.send_errors += 1;
            }
            if conn.lateness_us.len() == LATENESS_WINDOW {
                conn.lateness_us.pop_front();
            }
            let late = at.saturating_duration_since(deadline).as_micros();
            conn.lateness_us
                .push_back(u64::try_from(late).unwrap_or(u64::MAX));
        }
    }

    pub fn count_recv_error(&mut self) {
        self.recv_errors += 1;
    }

    /// Samples queued now.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Timeout events not yet taken.
    pub fn has_timeouts(&self) -> bool {
        !self.timeouts.is_empty()
    }

    /// Moves up to `max` samples, oldest first, and every timeout event out.
    pub fn drain(&mut self, max: usize) -> (Vec<Sample>, Vec<u64>) {
        let (samples, timeouts) = self.take(max);
        let named = samples.into_iter().map(|s| s.named(&self.names)).collect();
        (named, timeouts)
    }

    /// [`drain`](Self::drain) in O(1) when it takes the whole queue (the caller makes a
    /// Vec of it after letting go of the lock): the queue gets a fresh block as large.
    fn take(&mut self, max: usize) -> (VecDeque<QueuedSample>, Vec<u64>) {
        let n = max.min(self.queue.len());
        let samples = if n == self.queue.len() {
            std::mem::replace(&mut self.queue, VecDeque::with_capacity(n))
        } else {
            self.queue.drain(..n).collect()
        };
        (samples, std::mem::take(&mut self.timeouts))
    }

    /// Every field of the last good T-to-O assembly, ungated; None before the first.
    pub fn read(&self, key: u64) -> Result<Option<Vec<Reading>>, CoreError> {
        let conn = self
            .connections
            .get(&key)
            .ok_or_else(|| Self::unknown_key(key))?;
        Ok(conn.image.as_ref().map(|data| {
            conn.fields
                .iter()
                .zip(&conn.ids)
                .map(|(f, id)| (self.names[*id as usize].clone(), f.read_value(data)))
                .collect()
        }))
    }

    pub fn stats(&self, key: u64) -> Result<ConnectionStats, CoreError> {
        let c = self
            .connections
            .get(&key)
            .ok_or_else(|| Self::unknown_key(key))?;
        let mut late: Vec<u64> = c.lateness_us.iter().copied().collect();
        late.sort_unstable();
        let rank = |p: usize| (!late.is_empty()).then(|| late[(late.len() - 1) * p / 100]);
        Ok(ConnectionStats {
            state: c.state,
            t2o_connection_id: c.setup.t2o_connection_id,
            o2t_connection_id: c.setup.o2t_connection_id,
            t2o_api_us: c.setup.t2o_api_us,
            o2t_api_us: c.setup.o2t_api_us,
            last_sequence: c.last_sequence,
            last_cip_sequence: c.last_cip_sequence,
            run: c.last_run,
            datagrams_received: c.received,
            datagrams_produced: c.produced,
            o2t_sequence: c.o2t_sequence,
            o2t_cip_sequence: c.o2t_cip_sequence,
            drops: DROP_REASONS.iter().copied().zip(c.drops).collect(),
            watchdog_timeouts: c.watchdog_timeouts,
            send_errors: c.send_errors,
            lateness_p50_us: rank(50),
            lateness_p99_us: rank(99),
            lateness_max_us: late.last().copied(),
        })
    }

    pub fn global_stats(&self) -> GlobalStats {
        GlobalStats {
            datagrams_received: self.received,
            unknown_connection: self.unknown,
            malformed: Reason::ALL
                .iter()
                .map(|r| r.name())
                .zip(self.malformed)
                .collect(),
            recv_errors: self.recv_errors,
            queued: self.queue.len(),
            queue_capacity: self.capacity,
        }
    }
}

/// Settings fixed at bind.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub queue_capacity: usize,
    /// The interface multicast groups are joined on and sent from.
    pub multicast_interface: Ipv4Addr,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            multicast_interface: Ipv4Addr::LOCALHOST,
        }
    }
}

struct Inner {
    state: Mutex<Dispatcher>,
    ready: Condvar,
    stop: AtomicBool,
    socket: UdpSocket,
    waker: OwnedFd,
    interface: Ipv4Addr,
}

fn lock(state: &Mutex<Dispatcher>) -> MutexGuard<'_, Dispatcher> {
    // Nothing holding the lock panics; were it to, the counters are still sound.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Dispatcher> {
        lock(&self.state)
    }

    fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to an eventfd this struct owns. A
        // full counter (EAGAIN) still leaves the eventfd readable, so the result is moot.
        unsafe {
            libc::write(self.waker.as_raw_fd(), one.as_ptr().cast(), one.len());
        }
    }

    fn drain_waker(&self) {
        let mut count = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live 8-byte buffer from our eventfd.
        unsafe {
            libc::read(
                self.waker.as_raw_fd(),
                count.as_mut_ptr().cast(),
                count.len(),
            );
        }
    }
}

/// Blocks until `fds[i]` is readable or `timeout` passes; which ones are readable.
fn wait_readable(fds: [RawFd; 2], timeout: Option<Duration>) -> [bool; 2] {
    let mut polled = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    let spec = timeout.map(|t| libc::timespec {
        tv_sec: libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: t.subsec_nanos().into(),
    });
    let spec_ptr = spec
        .as_ref()
        .map_or(std::ptr::null(), |s| s as *const libc::timespec);
    // SAFETY: two live pollfd entries and an optional live timespec; no signal mask.
    let ready = unsafe { libc::ppoll(polled.as_mut_ptr(), 2, spec_ptr, std::ptr::null()) };
    if ready <= 0 {
        return [false, false];
    }
    polled.map(|p| p.revents != 0)
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn send_all(inner: &Inner, outgoing: &mut Vec<Outgoing>) {
    if outgoing.is_empty() {
        return;
    }
    let mut sent = Vec::with_capacity(outgoing.len());
    for out in outgoing.drain(..) {
        let at = Instant::now();
        let ok = inner.socket.send_to(&out.bytes, out.target).is_ok();
        sent.push((out.key, out.deadline, at, ok));
    }
    let mut d = inner.lock();
    for (key, deadline, at, ok) in sent {
        d.sent(key, deadline, at, ok);
    }
}

/// Runs due deadlines; answers the next one and the longest datagram to receive.
fn tick(inner: &Inner, outgoing: &mut Vec<Outgoing>) -> (Option<Instant>, usize) {
    let now = Instant::now();
    let next = {
        let mut d = inner.lock();
        if d.earliest().is_some_and(|e| e <= now) {
            d.on_time(now, outgoing);
            if d.has_timeouts() {
                inner.ready.notify_all();
            }
        }
        (d.earliest(), d.largest_datagram())
    };
    send_all(inner, outgoing);
    next
}

/// Preallocated recvmmsg(2) slots: one buffer, address and header per datagram, the
/// headers pointing into the others (heap blocks that stay put while the vectors do).
struct RecvSlots {
    slot: usize,
    bufs: Vec<u8>,
    /// Only the headers read these (kept alive here).
    _iovecs: Vec<libc::iovec>,
    addrs: Vec<libc::sockaddr_storage>,
    headers: Vec<libc::mmsghdr>,
}

impl RecvSlots {
    /// Slots that hold whole datagrams of `largest` bytes (at least MIN_SLOT_BYTES each).
    fn new(largest: usize) -> Self {
        let slot = largest.clamp(MIN_SLOT_BYTES, MAX_DATAGRAM);
        let count = (BATCH_BYTES / slot).clamp(1, RECV_BATCH);
        let mut bufs = vec![0u8; count * slot];
        let mut iovecs: Vec<libc::iovec> = bufs
            .chunks_exact_mut(slot)
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: slot,
            })
            .collect();
        // SAFETY: sockaddr_storage and mmsghdr are plain C structs; all zeros is valid.
        let mut addrs: Vec<libc::sockaddr_storage> =
            (0..count).map(|_| unsafe { std::mem::zeroed() }).collect();
        let headers = iovecs
            .iter_mut()
            .zip(addrs.iter_mut())
            .map(|(iov, addr)| {
                // SAFETY: as above.
                let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
                h.msg_hdr.msg_name = (addr as *mut libc::sockaddr_storage).cast();
                h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
                h.msg_hdr.msg_iov = iov;
                h.msg_hdr.msg_iovlen = 1;
                h
            })
            .collect();
        RecvSlots {
            slot,
            bufs,
            _iovecs: iovecs,
            addrs,
            headers,
        }
    }

    /// Receives what the socket holds, up to one datagram per slot, without blocking.
    fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        for h in &mut self.headers {
            h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
        }
        // MSG_TRUNC: each msg_len is the datagram's whole length, also when its slot cut it.
        // SAFETY: `headers` (len as passed) point to live iovecs and addresses of this
        // struct, each iovec to `slot` bytes of `bufs`; nothing else touches them meanwhile.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                self.headers.as_mut_ptr(),
                self.headers.len() as libc::c_uint,
                libc::MSG_TRUNC | libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    /// Datagram `i` of the last `recv`: its source, the bytes its slot holds and its length.
    fn get(&self, i: usize) -> (Option<SocketAddr>, &[u8], usize) {
        let h = &self.headers[i];
        let len = h.msg_len as usize;
        let head = &self.bufs[i * self.slot..][..len.min(self.slot)];
        (
            socket_addr(&self.addrs[i], h.msg_hdr.msg_namelen),
            head,
            len,
        )
    }
}

fn socket_addr(addr: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match libc::c_int::from(addr.ss_family) {
        libc::AF_INET if len >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the kernel wrote a sockaddr_in there (its family says so).
            let a =
                unsafe { &*(addr as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)).into(),
                u16::from_be(a.sin_port),
            ))
        }
        libc::AF_INET6 if len >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: the kernel wrote a sockaddr_in6 there (its family says so).
            let a =
                unsafe { &*(addr as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                a.sin6_addr.s6_addr.into(),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Feeds one received batch to the dispatcher under one lock. Whenever a deadline is due
/// between two datagrams (`clock` says), it lets go of the lock and runs `due` (which
/// produces): a flood must not hold up O-to-T production. Every datagram counts as
/// received at `at`, when the batch was taken off the socket. Answers whether any samples
/// were queued.
fn dispatch_batch<'a>(
    state: &Mutex<Dispatcher>,
    datagrams: impl IntoIterator<Item = (Option<SocketAddr>, &'a [u8], usize)>,
    at: Instant,
    wall_ms: u64,
    mut clock: impl FnMut() -> Instant,
    mut due: impl FnMut(),
) -> bool {
    let mut queued = false;
    let mut d = lock(state);
    for (src, head, len) in datagrams {
        match src {
            Some(src) => {
                let outcome = d.on_received(src, head, len, at, wall_ms);
                queued |= matches!(outcome, Outcome::Accepted { samples, .. } if samples > 0);
            }
            // Not an IP source: the socket API would have failed this receive.
            None => d.count_recv_error(),
        }
        if d.earliest().is_some_and(|e| e <= clock()) {
            drop(d);
            due();
            d = lock(state);
        }
    }
    queued
}

/// The scheduler slice the I/O thread asks for (EEVDF, Linux 6.12+): how soon it may
/// preempt a busy thread when its deadline wakes it. The default (0.75 ms x (1 + log2
/// CPUs), 1.5 ms on two cores) was the whole p99 jitter of a 2 ms API under load.
const IO_SLICE_NS: u64 = 100_000;

/// `struct sched_attr`, its first version (48 bytes), as sched_setattr(2) reads it.
#[repr(C)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

/// Asks for [`IO_SLICE_NS`] under SCHED_OTHER at the thread's current nice value; a kernel
/// without custom slices (or a sandbox that forbids the call) keeps the default, silently.
fn request_short_slice() {
    // SAFETY: getpriority reads this thread's nice value; sched_setattr reads a
    // sched_attr of the size it names, which outlives the call. Neither touches memory
    // of ours otherwise.
    unsafe {
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
        if nice == -1 && *libc::__errno_location() != 0 {
            return;
        }
        let attr = SchedAttr {
            size: std::mem::size_of::<SchedAttr>() as u32,
            policy: libc::SCHED_OTHER as u32,
            flags: 0,
            nice,
            priority: 0,
            runtime: IO_SLICE_NS,
            deadline: 0,
            period: 0,
        };
        libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0);
    }
}

fn run(inner: Arc<Inner>) {
    // SAFETY: prctl with PR_SET_TIMERSLACK takes one integer; it only narrows how late
    // this thread's timers may fire (default 50 us).
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
    }
    request_short_slice();
    let fds = [inner.socket.as_raw_fd(), inner.waker.as_raw_fd()];
    let mut slots = RecvSlots::new(0);
    let mut outgoing = Vec::new();
    while !inner.stop.load(Ordering::Acquire) {
        let (next, largest) = tick(&inner, &mut outgoing);
        if largest.clamp(MIN_SLOT_BYTES, MAX_DATAGRAM) != slots.slot {
            slots = RecvSlots::new(largest);
        }
        let now = Instant::now();
        if next.is_some_and(|n| n <= now) {
            continue;
        }
        let [readable, woken] = wait_readable(fds, next.map(|n| n - now));
        if woken {
            inner.drain_waker();
        }
        if !readable {
            continue;
        }
        let n = match slots.recv(fds[0]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => {
                inner.lock().count_recv_error();
                continue;
            }
        };
        let queued = dispatch_batch(
            &inner.state,
            (0..n).map(|i| slots.get(i)),
            Instant::now(),
            wall_ms(),
            Instant::now,
            || {
                tick(&inner, &mut outgoing);
            },
        );
        if queued {
            inner.ready.notify_all();
        }
    }
    inner.ready.notify_all();
}

/// The class-1 I/O engine: one socket, one thread, every connection.
pub struct IoEngine {
    inner: Arc<Inner>,
    thread: Mutex<Option<JoinHandle<()>>>,
    local: SocketAddr,
}

impl IoEngine {
    /// Binds the socket (SO_RCVBUF 4 MiB asked; exclusive) and starts the thread.
    pub fn bind(addr: SocketAddr, options: EngineOptions) -> Result<IoEngine, CoreError> {
        let fail = |what: &str, e: io::Error| CoreError::io(format!("{what} {addr}"), &e);
        let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))
            .map_err(|e| fail("socket for", e))?;
        // No SO_REUSEADDR: two UDP sockets sharing port 2222 would split the T-to-O
        // stream between them silently; a second engine on the port must fail to bind.
        // The kernel grants what net.core.rmem_max allows; less is not an error.
        let _ = socket.set_recv_buffer_size(RECV_BUFFER_BYTES);
        if addr.is_ipv4() {
            socket
                .set_multicast_if_v4(&options.multicast_interface)
                .map_err(|e| {
                    fail(
                        &format!("IP_MULTICAST_IF {} for", options.multicast_interface),
                        e,
                    )
                })?;
        }
        socket.bind(&addr.into()).map_err(|e| fail("bind", e))?;
        socket
            .set_nonblocking(true)
            .map_err(|e| fail("O_NONBLOCK on", e))?;
        let socket: UdpSocket = socket.into();
        let local = socket
            .local_addr()
            .map_err(|e| fail("local address of", e))?;
        // SAFETY: eventfd takes two integers; a negative result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(fail("eventfd for", io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let waker = unsafe { OwnedFd::from_raw_fd(fd) };
        let inner = Arc::new(Inner {
            state: Mutex::new(Dispatcher::new(options.queue_capacity, Instant::now())),
            ready: Condvar::new(),
            stop: AtomicBool::new(false),
            socket,
            waker,
            interface: options.multicast_interface,
        });
        let worker = inner.clone();
        let thread = std::thread::Builder::new()
            .name("unskit-cip-io".into())
            .spawn(move || run(worker))
            .map_err(|e| fail("thread for", e))?;
        Ok(IoEngine {
            inner,
            thread: Mutex::new(Some(thread)),
            local,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub fn local_port(&self) -> u16 {
        self.local.port()
    }

    fn running(&self) -> Result<(), CoreError> {
        if self.inner.stop.load(Ordering::Acquire) {
            return Err(CoreError::InvalidCip("the I/O engine is shut down".into()));
        }
        Ok(())
    }

    /// Opens connection `key`, joining its multicast group first when it is the first user.
    pub fn open(&self, key: u64, setup: ConnectionSetup) -> Result<(), CoreError> {
        self.running()?;
        let mut d = self.inner.lock();
        let join = setup
            .multicast_group
            .filter(|g| g.is_multicast() && d.group_users(*g) == 0);
        if let Some(group) = join {
            self.inner
                .socket
                .join_multicast_v4(&group, &self.inner.interface)
                .map_err(|e| {
                    CoreError::io(format!("join {group} on {}", self.inner.interface), &e)
                })?;
        }
        if let Err(e) = d.open(key, setup, Instant::now()) {
            if let Some(group) = join {
                let _ = self
                    .inner
                    .socket
                    .leave_multicast_v4(&group, &self.inner.interface);
            }
            return Err(e);
        }
        drop(d);
        self.inner.wake();
        Ok(())
    }

    /// Stops producing for `key` and forgets it (leaving its group when it was the last).
    pub fn close(&self, key: u64) -> Result<(), CoreError> {
        let mut d = self.inner.lock();
        if let Some(group) = d.close(key)? {
            let _ = self
                .inner
                .socket
                .leave_multicast_v4(&group, &self.inner.interface);
        }
        drop(d);
        self.inner.wake();
        Ok(())
    }

    /// Replaces the whole O-to-T image (one datagram carries all of it).
    pub fn set_output(&self, key: u64, image: Vec<u8>, run: Option<bool>) -> Result<(), CoreError> {
        self.inner.lock().set_output(key, image, run)?;
        self.inner.wake();
        Ok(())
    }

    /// Waits up to `timeout` for samples or timeout events; returns at once when some are
    /// queued (at most `max` samples) and empty when shut down.
    pub fn poll(&self, timeout: Duration, max: usize) -> (Vec<Sample>, Vec<u64>) {
        let polled = self.poll_queued(timeout, max);
        let names = &polled.names;
        let samples = polled.samples.into_iter().map(|s| s.named(names)).collect();
        (samples, polled.timed_out)
    }

    /// [`poll`](Self::poll) with signal ids by index (the consumer resolves each once).
    pub fn poll_queued(&self, timeout: Duration, max: usize) -> Polled {
        let deadline = Instant::now() + timeout;
        let mut d = self.inner.lock();
        loop {
            if d.queued() > 0 || d.has_timeouts() || self.inner.stop.load(Ordering::Acquire) {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            d = match self.inner.ready.wait_timeout(d, deadline - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        let (samples, timed_out) = d.take(max);
        let names = d.names();
        drop(d);
        Polled {
            samples: samples.into(),
            names,
            timed_out,
        }
    }

    pub fn read(&self, key: u64) -> Result<Option<Vec<Reading>>, CoreError> {
        self.inner.lock().read(key)
    }

    pub fn stats(&self, key: u64) -> Result<ConnectionStats, CoreError> {
        self.inner.lock().stats(key)
    }

    pub fn global_stats(&self) -> GlobalStats {
        self.inner.lock().global_stats()
    }

    /// Stops and joins the thread; idempotent.
    pub fn shutdown(&self) {
        self.inner.stop.store(true, Ordering::Release);
        self.inner.wake();
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
        self.inner.ready.notify_all();
    }
}

impl Drop for IoEngine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cip::plan::{FieldSpec, Scalar};
    use crate::cip::types::CipType;
    use crate::signal::Deadband;
    use proptest::prelude::*;

    const T2O: u32 = 0x1000_0001;
    const TARGET: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);

    fn field(name: &str, offset: usize, ty: CipType, deadband: Deadband) -> FieldSpec {
        FieldSpec {
            name: name.into(),
            offset,
            ty,
            bit: None,
            array_count: None,
            scale: None,
            value_offset: None,
            deadband,
            always: false,
        }
    }

    /// DINT "a" at 0, INT "b" at 4 with an absolute deadband of 5; 8 bytes, header32.
    fn setup(t2o: u32) -> ConnectionSetup {
        let specs = [
            field("a", 0, CipType::Dint, Deadband::None),
            field("b", 4, CipType::Int, Deadband::Absolute(5.0)),
        ];
        ConnectionSetup {
            t2o_connection_id: t2o,
            o2t_connection_id: t2o + 0x100,
            target: SocketAddr::new(TARGET.into(), 2222),
            source: TARGET.into(),
            t2o_api_us: 10_000,
            o2t_api_us: 10_000,
            timeout_multiplier: 4,
            input: InputPlan::new(100, 8, RealTimeFormat::Header32, 0, &specs).unwrap(),
            output_format: RealTimeFormat::Header32,
            output_image: vec![0; 2],
            run: true,
            multicast_group: None,
        }
    }

    fn data(a: i32, b: i16) -> Vec<u8> {
        let mut out = a.to_le_bytes().to_vec();
        out.extend_from_slice(&b.to_le_bytes());
        out.extend_from_slice(&[0, 0]);
        out
    }

    fn dg(conn: u32, seq: u32, data: &[u8], run: bool) -> Vec<u8> {
        let mut out = Vec::new();
        frame::build(
            &mut out,
            conn,
            seq,
            seq as u16,
            RealTimeFormat::Header32,
            run,
            data,
        )
        .unwrap();
        out
    }

    fn from(ip: [u8; 4]) -> SocketAddr {
        SocketAddr::new(Ipv4Addr::from(ip).into(), 2222)
    }

    fn opened(t0: Instant) -> Dispatcher {
        let mut d = Dispatcher::new(100, t0);
        d.open(1, setup(T2O), t0).unwrap();
        d
    }

    fn drops(d: &Dispatcher, key: u64) -> HashMap<&'static str, u64> {
        d.stats(key).unwrap().drops.into_iter().collect()
    }

    #[test]
    fn good_datagrams_queue_the_fields_due_and_read_is_ungated() {
        let t0 = Instant::now();
        let mut d = opened(t0);
        assert_eq!(d.read(1).unwrap(), None);
        let out = d.on_datagram(
            from([127, 0, 0, 1]),
            &dg(T2O, 1, &data(7, 100), true),
            t0,
            42,
        );
        assert_eq!(out, Outcome::Accepted { key: 1, samples: 2 });
        // b moves inside its deadband: only a publishes; the idle bit is carried.
        let out = d.on_datagram(
            from([127, 0, 0, 1]),
            &dg(T2O, 2, &data(8, 103), false),
            t0,
            43,
        );
        assert_eq!(out, Outcome::Accepted { key: 1, samples: 1 });
        let (samples, timeouts) = d.drain(10);
        assert!(timeouts.is_empty());
        let rows: Vec<_> = samples
            .iter()
            .map(|s| (s.key, &*s.signal, s.value.clone(), s.ts_ms, s.run))
            .collect();
        let int = |i| Value::Scalar(Scalar::Int(i));
        assert_eq!(
            rows,
            [
                (1, "a100/0/DINT", int(7), 42, Some(true)),
                (1, "a100/4/INT", int(100), 42, Some(true)),
                (1, "a100/0/DINT", int(8), 43, Some(false)),
            ]
        );
        let read = d.read(1).unwrap().unwrap();
        assert_eq!(read[1], (Arc::from("a100/4/INT"), int(103)));
        let stats = d.stats(1).unwrap();
        assert_eq!(
            (stats.last_sequence, stats.last_cip_sequence, stats.run),
            (Some(2), Some(2), Some(false))
        );
        assert_eq!(stats.datagrams_received, 2);
        assert_eq!(d.global_stats().datagrams_received, 2);
    }

    #[test]
    fn every_drop_reason_is_counted_where_it_belongs() {
        let t0 = Instant::now();
        let mut d = opened(t0);
        let good = dg(T2O, 10, &data(1, 1), true);
        let me = from([127, 0, 0, 1]);
        let reason = |d: &mut Dispatcher, src, bytes: &[u8]| match d.on_datagram(src, bytes, t0, 0)
        {
            Outcome::Dropped { key: 1, reason } => reason.name(),
            other => panic!("{other:?}"),
        };
        assert_eq!(reason(&mut d, from([127, 0, 0, 2]), &good), "wrong_source");
        assert_eq!(reason(&mut d, me, &good[..20]), "truncated");
        assert_eq!(
            reason(&mut d, me, &dg(T2O, 11, &[0; 7], true)),
            "wrong_size"
        );
        let mut long = good.clone();
        long.push(0);
        assert_eq!(reason(&mut d, me, &long), "trailing_bytes");
        let mut item = good.clone();
        item[14] = 0xB2;
        assert_eq!(reason(&mut d, me, &item), "data_item");
        let mut short = good.clone();
        short[16] = 4; // shorter than the sequence count and run/idle header
        assert_eq!(reason(&mut d, me, &short[..22]), "data_length");
        assert!(matches!(
            d.on_datagram(me, &good, t0, 0),
            Outcome::Accepted { .. }
        ));
        assert_eq!(reason(&mut d, me, &good), "duplicate");
        assert_eq!(reason(&mut d, me, &dg(T2O, 9, &data(1, 1), true)), "stale");
        let counts = drops(&d, 1);
        for name in [
            "wrong_source",
            "truncated",
            "wrong_size",
            "trailing_bytes",
            "data_item",
            "data_length",
            "duplicate",
            "stale",
        ] {
            assert_eq!(counts[name], 1, "{name}");
        }
        assert_eq!(d.stats(1).unwrap().datagrams_received, 9);
        // Datagrams whose connection cannot be told count globally.
        assert_eq!(
            d.on_datagram(me, &dg(T2O + 1, 1, &data(0, 0), true), t0, 0),
            Outcome::UnknownConnection
        );
        let mut count = good.clone();
        count[0] = 3;
        assert_eq!(
            d.on_datagram(me, &count, t0, 0),
            Outcome::Malformed(Reason::ItemCount)
        );
        let mut addr = good.clone();
        addr[2] = 0;
        assert_eq!(
            d.on_datagram(me, &addr, t0, 0),
            Outcome::Malformed(Reason::AddressItem)
        );
        let mut len = good.clone();
        len[4] = 4;
        assert_eq!(
            d.on_datagram(me, &len, t0, 0),
            Outcome::Malformed(Reason::AddressLength)
        );
        assert_eq!(
            d.on_datagram(me, &good[..9], t0, 0),
            Outcome::Malformed(Reason::Truncated)
        );
        assert_eq!(
            d.on_datagram(me, &[], t0, 0),
            Outcome::Malformed(Reason::Truncated)
        );
        let global = d.global_stats();
        assert_eq!(global.unknown_connection, 1);
        let malformed: HashMap<_, _> = global.malformed.into_iter().collect();
        assert_eq!(
            (
                malformed["item_count"],
                malformed["address_item"],
                malformed["address_length"],
                malformed["truncated"]
            ),
            (1, 1, 1, 2)
        );
        assert_eq!(global.datagrams_received, 15);
        assert_eq!(d.stats(1).unwrap().last_sequence, Some(10));
    }

    #[test]
    fn sequence_numbers_use_serial_arithmetic_across_the_wrap() {
        let t0 = Instant::now();
        let mut d = opened(t0);
        let me = from([127, 0, 0, 1]);
        let mut at =
            |seq: u32| match d.on_datagram(me, &dg(T2O, seq, &data(seq as i32, 0), true), t0, 0) {
                Outcome::Accepted { .. } => "ok",
                Outcome::Dropped { reason, .. } => reason.name(),
                other => panic!("{other:?}"),
            };
        assert_eq!(at(0xFFFF_FFFE), "ok");
        assert_eq!(at(0xFFFF_FFFF), "ok");
        assert_eq!(at(0), "ok");
        assert_eq!(at(0xFFFF_FFFF), "stale");
        assert_eq!(at(0), "duplicate");
        assert_eq!(at(5), "ok"); // a gap is fine
        assert_eq!(at(5 + 0x8000_0000), "stale"); // half the space away is not newer
        assert_eq!(at(5 + 0x7FFF_FFFF), "ok");
    }

    #[test]
    fn a_full_queue_drops_samples_and_counts_them() {
        let t0 = Instant::now();
        let mut d = Dispatcher::new(3, t0);
        d.open(1, setup(T2O), t0).unwrap();
        let me = from([127, 0, 0, 1]);
        d.on_datagram(me, &dg(T2O, 1, &data(1, 0), true), t0, 0);
        let out = d.on_datagram(me, &dg(T2O, 2, &data(2, 100), true), t0, 0);
        assert_eq!(out, Outcome::Accepted { key: 1, samples: 1 });
        assert_eq!(drops(&d, 1)["queue_full"], 1);
        assert_eq!(d.global_stats().queued, 3);
        assert_eq!(d.drain(2).0.len(), 2);
        assert_eq!(d.drain(10).0.len(), 1);
        assert_eq!(d.queued(), 0);
        // The same data again: the field the full queue dropped is offered again (its
        // last publication is the old value), the one that was queued is not.
        let again = d.on_datagram(me, &dg(T2O, 3, &data(2, 100), true), t0, 0);
        assert_eq!(again, Outcome::Accepted { key: 1, samples: 1 });
    }

    #[test]
    fn the_watchdog_runs_from_open_and_from_each_good_datagram() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut d = opened(t0); // 4 x 10 ms
        let mut out = Vec::new();
        d.on_time(t0 + ms(39), &mut out);
        assert_eq!(d.stats(1).unwrap().state, ConnectionState::Open);
        d.on_datagram(
            from([127, 0, 0, 1]),
            &dg(T2O, 1, &data(0, 0), true),
            t0 + ms(30),
            0,
        );
        d.on_time(t0 + ms(69), &mut out);
        assert!(!d.has_timeouts());
        out.clear();
        d.on_time(t0 + ms(70), &mut out);
        assert!(out.is_empty(), "no production once timed out");
        let stats = d.stats(1).unwrap();
        assert_eq!(
            (stats.state, stats.watchdog_timeouts),
            (ConnectionState::TimedOut, 1)
        );
        assert_eq!(d.drain(10).1, [1]);
        assert_eq!(d.earliest(), None);
        d.on_time(t0 + ms(500), &mut out);
        assert!(out.is_empty() && !d.has_timeouts(), "expires once");
        let late = d.on_datagram(
            from([127, 0, 0, 1]),
            &dg(T2O, 2, &data(0, 0), true),
            t0 + ms(501),
            0,
        );
        assert_eq!(
            late,
            Outcome::Dropped {
                key: 1,
                reason: DropReason::TimedOut
            }
        );
        // A timeout event not yet taken is forgotten with its connection.
        let mut e = opened(t0);
        e.on_time(t0 + ms(40), &mut out);
        assert!(e.has_timeouts());
        e.close(1).unwrap();
        assert!(!e.has_timeouts());
        e.open(1, setup(T2O), t0 + ms(41)).unwrap();
        assert_eq!(e.stats(1).unwrap().state, ConnectionState::Open);
    }

    #[test]
    fn production_keeps_absolute_deadlines_and_skips_missed_periods() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = setup(T2O);
        s.timeout_multiplier = 1000;
        let mut d = Dispatcher::new(10, t0);
        d.open(7, s, t0).unwrap();
        let mut out = Vec::new();
        let mut produce = |d: &mut Dispatcher, at: Duration| {
            out.clear();
            d.on_time(t0 + at, &mut out);
            out.iter()
                .map(|o| {
                    let p = frame::parse_datagram(&o.bytes, RealTimeFormat::Header32, 2).unwrap();
                    assert_eq!(
                        (o.key, o.target, p.connection_id),
                        (7, SocketAddr::new(TARGET.into(), 2222), T2O + 0x100)
                    );
                    (
                        o.deadline - t0,
                        p.sequence_number,
                        p.cip_sequence,
                        p.run(),
                        p.data.to_vec(),
                    )
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(produce(&mut d, ms(0)), [(ms(0), 1, 1, true, vec![0, 0])]);
        assert_eq!(d.earliest(), Some(t0 + ms(10)));
        assert_eq!(produce(&mut d, ms(5)), []);
        assert_eq!(
            produce(&mut d, Duration::from_micros(10_500)),
            [(ms(10), 2, 1, true, vec![0, 0])]
        );
        d.set_output(7, vec![1, 2], None).unwrap();
        d.set_output(7, vec![1, 2], Some(true)).unwrap(); // no change
                                                          // 35 ms late: one datagram for the 20 ms deadline, then on to 60 ms.
        assert_eq!(produce(&mut d, ms(55)), [(ms(20), 3, 2, true, vec![1, 2])]);
        assert_eq!(d.earliest(), Some(t0 + ms(60)));
        assert_eq!(produce(&mut d, ms(59)), []);
        d.set_output(7, vec![1, 2], Some(false)).unwrap();
        assert_eq!(produce(&mut d, ms(60)), [(ms(60), 4, 3, false, vec![1, 2])]);
        assert!(d
            .set_output(7, vec![1], None)
            .unwrap_err()
            .to_string()
            .contains("2 bytes, got 1"));
        d.sent(
            7,
            t0 + ms(60),
            t0 + ms(60) + Duration::from_micros(250),
            true,
        );
        d.sent(
            7,
            t0 + ms(70),
            t0 + ms(70) + Duration::from_micros(50),
            false,
        );
        d.sent(7, t0 + ms(80), t0 + ms(80), true);
        let stats = d.stats(7).unwrap();
        assert_eq!(
            (
                stats.lateness_p50_us,
                stats.lateness_p99_us,
                stats.lateness_max_us
            ),
            (Some(50), Some(50), Some(250))
        );
        assert_eq!(
            (
                stats.datagrams_produced,
                stats.send_errors,
                stats.o2t_sequence
            ),
            (4, 1, 4)
        );
    }

    #[test]
    fn opening_checks_its_setup_and_counts_multicast_users() {
        let t0 = Instant::now();
        let mut d = opened(t0);
        let err = |d: &mut Dispatcher, key, s| d.open(key, s, t0).unwrap_err().to_string();
        assert!(err(&mut d, 1, setup(T2O + 5)).contains("already open"));
        assert!(err(&mut d, 2, setup(T2O)).contains("already used by connection 1"));
        let mut s = setup(T2O + 5);
        s.o2t_api_us = 0;
        assert!(err(&mut d, 2, s).contains("APIs"));
        let mut s = setup(T2O + 5);
        s.timeout_multiplier = 0;
        assert!(err(&mut d, 2, s).contains("timeout_multiplier"));
        let mut s = setup(T2O + 5);
        s.multicast_group = Some(Ipv4Addr::new(10, 0, 0, 1));
        assert!(err(&mut d, 2, s).contains("not a multicast group"));
        let mut s = setup(T2O + 5);
        s.output_format = RealTimeFormat::Heartbeat;
        assert!(err(&mut d, 2, s).contains("heartbeat"));
        let group = Ipv4Addr::new(239, 192, 1, 1);
        for (key, t2o) in [(2, T2O + 2), (3, T2O + 3)] {
            let mut s = setup(t2o);
            s.multicast_group = Some(group);
            d.open(key, s, t0).unwrap();
        }
        assert_eq!(d.group_users(group), 2);
        assert_eq!(d.close(2).unwrap(), None);
        assert_eq!(d.close(3).unwrap(), Some(group));
        assert_eq!(d.group_users(group), 0);
        assert!(d.close(3).is_err());
        assert!(d.stats(3).is_err() && d.read(3).is_err());
        // A closed connection's id is free again and unknown meanwhile.
        assert_eq!(
            d.on_datagram(
                from([127, 0, 0, 1]),
                &dg(T2O + 3, 1, &data(0, 0), true),
                t0,
                0
            ),
            Outcome::UnknownConnection
        );
    }

    #[test]
    fn drop_reasons_start_with_the_frame_reasons() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(DROP_REASONS[i], r.name());
            assert_eq!(DropReason::Frame(*r).name(), r.name());
        }
        for r in [
            DropReason::Duplicate,
            DropReason::Stale,
            DropReason::WrongSource,
            DropReason::QueueFull,
            DropReason::TimedOut,
        ] {
            assert_eq!(DROP_REASONS.iter().filter(|n| **n == r.name()).count(), 1);
        }
    }

    /// Two dispatchers with the same connections open: one fed a datagram at a time,
    /// one through the batch path.
    fn same_pair(t0: Instant) -> (Dispatcher, Mutex<Dispatcher>) {
        let make = || {
            let mut d = Dispatcher::new(100, t0);
            d.open(1, setup(T2O), t0).unwrap();
            let mut wide = setup(T2O + 7);
            wide.input = InputPlan::new(
                101,
                64,
                RealTimeFormat::Header32,
                0,
                &[field("w", 0, CipType::Dint, Deadband::None)],
            )
            .unwrap();
            d.open(2, wide, t0).unwrap();
            d.on_time(t0, &mut Vec::new()); // the first productions: nothing due at t0 then
            d
        };
        (make(), Mutex::new(make()))
    }

    #[test]
    fn a_batch_counts_exactly_as_one_datagram_at_a_time() {
        let t0 = Instant::now();
        let me = from([127, 0, 0, 1]);
        let good = |seq| dg(T2O, seq, &data(seq as i32, 0), true);
        let mut long = good(20);
        long.extend_from_slice(&[9; 40]); // trailing bytes past a cut
        let mut count = good(21);
        count[0] = 3;
        // (source, whole datagram, bytes the receive slot kept)
        let cut = 30;
        let batch: Vec<(SocketAddr, Vec<u8>, usize)> = vec![
            (me, good(1), usize::MAX),
            (me, count, usize::MAX),                             // malformed
            (me, good(2)[..20].to_vec(), usize::MAX),            // truncated
            (from([127, 0, 0, 9]), good(3), usize::MAX),         // wrong source
            (me, dg(T2O + 1, 4, &data(0, 0), true), usize::MAX), // unknown connection
            (me, good(2), usize::MAX),
            (me, good(2), usize::MAX),                        // duplicate
            (me, good(1), usize::MAX),                        // stale
            (me, long, cut),                                  // cut: trailing bytes
            (me, dg(T2O, 22, &[0; 60], true), cut),           // cut: wrong size
            (me, dg(T2O + 9, 23, &[0; 60], true), cut),       // cut: unknown
            (me, dg(T2O + 7, 1, &[0; 64], true), usize::MAX), // good, 88 bytes
            (me, dg(T2O + 7, 2, &[0; 66], true), cut),        // cut: wrong size
            (me, good(5), usize::MAX),
            (me, vec![], usize::MAX), // malformed: empty
        ];
        let (mut one, batched) = same_pair(t0);
        let one_by_one: Vec<Outcome> = batch
            .iter()
            .map(|(src, bytes, _)| one.on_datagram(*src, bytes, t0, 5))
            .collect();
        let queued = dispatch_batch(
            &batched,
            batch.iter().map(|(src, bytes, keep)| {
                (Some(*src), &bytes[..bytes.len().min(*keep)], bytes.len())
            }),
            t0,
            5,
            || t0,
            || panic!("nothing is due"),
        );
        assert!(queued);
        let batched = batched.into_inner().unwrap();
        for key in [1, 2] {
            assert_eq!(
                one.stats(key).unwrap(),
                batched.stats(key).unwrap(),
                "{key}"
            );
        }
        assert_eq!(one.global_stats(), batched.global_stats());
        assert_eq!(drops(&one, 1)["trailing_bytes"], 1);
        assert_eq!(drops(&one, 1)["wrong_size"], 1);
        assert_eq!(drops(&one, 2)["wrong_size"], 1);
        assert_eq!(one.global_stats().unknown_connection, 2);
        assert_eq!(one_by_one.len(), 15);
        let mut batched = batched;
        assert_eq!(one.drain(100), batched.drain(100));
        // A source the socket API cannot name counts as a receive error.
        let lone = Mutex::new(Dispatcher::new(4, t0));
        dispatch_batch(&lone, [(None, &[][..], 0)], t0, 0, || t0, || ());
        assert_eq!(lone.into_inner().unwrap().global_stats().recv_errors, 1);
    }

    #[test]
    fn a_cut_datagram_a_connection_would_accept_is_dropped_as_truncated() {
        let t0 = Instant::now();
        let (_, d) = same_pair(t0);
        let mut d = d.into_inner().unwrap();
        let whole = dg(T2O + 7, 1, &[0; 64], true);
        let out = d.on_received(from([127, 0, 0, 1]), &whole[..40], whole.len(), t0, 0);
        assert_eq!(
            out,
            Outcome::Dropped {
                key: 2,
                reason: DropReason::Frame(Reason::Truncated)
            }
        );
        assert_eq!(d.stats(2).unwrap().last_sequence, None);
        assert_eq!(d.largest_datagram(), whole.len());
        d.close(2).unwrap();
        assert_eq!(d.largest_datagram(), dg(T2O, 1, &data(0, 0), true).len());
    }

    #[test]
    fn a_deadline_due_inside_a_long_batch_runs_between_datagrams() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = setup(T2O);
        s.timeout_multiplier = 1000;
        let mut first = Dispatcher::new(10_000, t0);
        first.open(1, s, t0).unwrap();
        let mut out = Vec::new();
        first.on_time(t0, &mut out); // the first production; the next is due at 10 ms
        assert_eq!((out.len(), first.earliest()), (1, Some(t0 + ms(10))));
        let state = Mutex::new(first);
        let frames: Vec<Vec<u8>> = (1..=300)
            .map(|seq| dg(T2O, seq, &data(0, 0), true))
            .collect();
        // The clock moves 100 us per look: 10 ms is due at the 100th datagram.
        let clock = std::cell::Cell::new(t0);
        let ran = std::cell::RefCell::new(Vec::new());
        dispatch_batch(
            &state,
            frames
                .iter()
                .map(|f| (Some(from([127, 0, 0, 1])), &f[..], f.len())),
            t0,
            0,
            || {
                clock.set(clock.get() + Duration::from_micros(100));
                clock.get()
            },
            || {
                let mut d = lock(&state);
                let mut out = Vec::new();
                d.on_time(clock.get(), &mut out);
                let seen = d.global_stats().datagrams_received;
                ran.borrow_mut()
                    .extend(out.iter().map(|o| (seen, o.deadline - t0)));
            },
        );
        assert_eq!(
            ran.into_inner(),
            [(100, ms(10)), (200, ms(20)), (300, ms(30))]
        );
        let d = state.into_inner().unwrap();
        assert_eq!(d.stats(1).unwrap().datagrams_produced, 4);
        assert_eq!(d.stats(1).unwrap().last_sequence, Some(300));
    }

    #[test]
    fn queued_samples_name_their_signal_after_a_close_and_a_reopen_reuses_the_names() {
        let t0 = Instant::now();
        let mut d = opened(t0);
        let me = from([127, 0, 0, 1]);
        d.on_datagram(me, &dg(T2O, 1, &data(7, 100), true), t0, 1);
        let names = d.names();
        assert_eq!(names.len(), 2);
        d.close(1).unwrap();
        d.open(1, setup(T2O), t0).unwrap();
        d.open(2, setup(T2O + 1), t0).unwrap();
        assert_eq!(d.names(), names, "the same ids, the same indices");
        let (samples, _) = d.drain(10);
        let signals: Vec<&str> = samples.iter().map(|s| &*s.signal).collect();
        assert_eq!(signals, ["a100/0/DINT", "a100/4/INT"]);
        let read = d.read(2).unwrap();
        assert_eq!(read, None);
        d.on_datagram(me, &dg(T2O + 1, 1, &data(1, 2), true), t0, 1);
        let read = d.read(2).unwrap().unwrap();
        assert_eq!((&*read[0].0, &*read[1].0), ("a100/0/DINT", "a100/4/INT"));
    }

    #[test]
    fn recv_slots_report_sources_lengths_and_cut_datagrams() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_nonblocking(true).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        let long = vec![7u8; MIN_SLOT_BYTES + 100];
        let sizes = [88usize, 0, 1];
        for n in sizes {
            tx.send_to(&vec![n as u8; n], to).unwrap();
        }
        tx.send_to(&long, to).unwrap();
        let mut slots = RecvSlots::new(0);
        assert_eq!(
            (slots.slot, slots.headers.len()),
            (MIN_SLOT_BYTES, RECV_BATCH)
        );
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < 4 {
            assert!(Instant::now() < deadline, "only {} datagrams", got.len());
            let [readable, _] = wait_readable(
                [rx.as_raw_fd(), rx.as_raw_fd()],
                Some(Duration::from_secs(1)),
            );
            if !readable {
                continue;
            }
            let n = slots.recv(rx.as_raw_fd()).unwrap();
            got.extend((0..n).map(|i| {
                let (src, head, len) = slots.get(i);
                (src, head.to_vec(), len)
            }));
        }
        let from_tx = Some(tx.local_addr().unwrap());
        for (i, n) in sizes.iter().enumerate() {
            assert_eq!(got[i], (from_tx, vec![*n as u8; *n], *n));
        }
        assert_eq!(
            got[3],
            (from_tx, long[..MIN_SLOT_BYTES].to_vec(), long.len())
        );
        let err = slots.recv(rx.as_raw_fd()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        // Slots for the longest datagram a connection accepts, within the same memory.
        let wide = RecvSlots::new(20_000);
        assert_eq!(
            (wide.slot, wide.headers.len()),
            (20_000, BATCH_BYTES / 20_000)
        );
        let widest = RecvSlots::new(1 << 20);
        assert_eq!((widest.slot, widest.headers.len()), (MAX_DATAGRAM, 8));
    }

    proptest! {
        #[test]
        fn on_datagram_never_panics_and_every_datagram_is_counted_once(
            frames in proptest::collection::vec(
                (proptest::collection::vec(any::<u8>(), 0..64), 0u32..4, any::<bool>(), any::<u32>(), any::<u64>()),
                1..40,
            ),
        ) {
            let t0 = Instant::now();
            let mut d = Dispatcher::new(16, t0);
            d.open(1, setup(T2O), t0).unwrap();
            d.open(2, setup(T2O + 1), t0).unwrap();
            let mut out = Vec::new();
            for (i, (bytes, conn, well_formed, seq, ms)) in frames.iter().enumerate() {
                let now = t0 + Duration::from_millis(*ms % 100_000);
                let wire = if *well_formed {
                    // A real frame of an open or unknown connection, data of any size.
                    dg(T2O + conn, *seq, bytes, *seq % 2 == 0)
                } else {
                    bytes.clone()
                };
                let src = from([127, 0, 0, 1 + (*seq % 2) as u8]);
                let _ = d.on_datagram(src, &wire, now, *ms);
                if i % 5 == 0 {
                    d.on_time(now, &mut out);
                    let _ = d.drain(3);
                }
            }
            let g = d.global_stats();
            let per: u64 = [1, 2].iter().map(|k| d.stats(*k).unwrap().datagrams_received).sum();
            let malformed: u64 = g.malformed.iter().map(|(_, n)| n).sum();
            prop_assert_eq!(g.datagrams_received, frames.len() as u64);
            prop_assert_eq!(g.datagrams_received, per + malformed + g.unknown_connection);
            prop_assert!(g.queued <= 16);
        }
    }
}
