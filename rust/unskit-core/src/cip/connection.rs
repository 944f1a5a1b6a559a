//! Connection Manager services (CIP Vol 1, 3-5.5) as Message Router requests and replies:
//! Forward Open (0x54), Large Forward Open (0x5B) and Forward Close (0x4E), addressed to
//! class 0x06 instance 1. Pure bytes, little-endian; the layouts follow the CIP
//! specification as Wireshark's `packet-cip.c` dissects them.
//!
//! ```text
//! request:  u8 service, u8 path words (2), 20 06 24 01, service data
//! reply:    u8 service|0x80, u8 reserved, u8 general status, u8 additional words,
//!           u16 additional status[words], service data
//! ```
//! Decoders never panic: truncated or malformed bytes answer `CoreError::InvalidCip`.

use crate::error::CoreError;

pub const SERVICE_FORWARD_OPEN: u8 = 0x54;
pub const SERVICE_LARGE_FORWARD_OPEN: u8 = 0x5B;
pub const SERVICE_FORWARD_CLOSE: u8 = 0x4E;
/// Set in a reply's service byte.
pub const REPLY_BIT: u8 = 0x80;
/// The Connection Manager object: logical class 0x06, instance 1.
pub const CONNECTION_MANAGER_PATH: [u8; 4] = [0x20, 0x06, 0x24, 0x01];
/// Connection sizes above this use Large Forward Open (issue 22): 511 is the 9-bit field's
/// maximum, less the 2-byte sequence count and 4-byte run/idle header some targets add.
pub const MAX_SMALL_CONNECTION_SIZE: u16 = 505;
/// Assembly object class in a connection path.
pub const ASSEMBLY_CLASS: u8 = 0x04;
/// General status of a failed connection service; the extended status says why.
pub const GENERAL_CONNECTION_FAILURE: u8 = 0x01;

fn invalid(detail: impl Into<String>) -> CoreError {
    CoreError::InvalidCip(detail.into())
}

/// A bounds-checked little-endian reader: every short read is an error, never a panic.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Self { bytes, at: 0, what }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], CoreError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        match end {
            Some(end) => {
                let out = &self.bytes[self.at..end];
                self.at = end;
                Ok(out)
            }
            None => Err(invalid(format!(
                "{} truncated: {} bytes, needed {} at offset {}",
                self.what,
                self.bytes.len(),
                n,
                self.at
            ))),
        }
    }

    fn u8(&mut self) -> Result<u8, CoreError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, CoreError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, CoreError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn rest(&mut self) -> &'a [u8] {
        let out = &self.bytes[self.at..];
        self.at = self.bytes.len();
        out
    }

    fn finish(&self) -> Result<(), CoreError> {
        if self.remaining() == 0 {
            Ok(())
        } else {
            Err(invalid(format!(
                "{}: {} trailing bytes",
                self.what,
                self.remaining()
            )))
        }
    }
}

/// Network connection type, bits 14-13 (16-bit) or 30-29 (32-bit) of the parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionType {
    Null,
    Multicast,
    PointToPoint,
}

impl ConnectionType {
    fn bits(self) -> u32 {
        match self {
            Self::Null => 0,
            Self::Multicast => 1,
            Self::PointToPoint => 2,
        }
    }

    fn from_bits(bits: u32) -> Result<Self, CoreError> {
        match bits {
            0 => Ok(Self::Null),
            1 => Ok(Self::Multicast),
            2 => Ok(Self::PointToPoint),
            _ => Err(invalid("network connection type 3 is reserved")),
        }
    }
}

/// Connection priority, bits 11-10 (16-bit) or 27-26 (32-bit) of the parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    Low,
    High,
    Scheduled,
    Urgent,
}

impl Priority {
    fn bits(self) -> u32 {
        match self {
            Self::Low => 0,
            Self::High => 1,
            Self::Scheduled => 2,
            Self::Urgent => 3,
        }
    }

    fn from_bits(bits: u32) -> Self {
        match bits & 3 {
            0 => Self::Low,
            1 => Self::High,
            2 => Self::Scheduled,
            _ => Self::Urgent,
        }
    }
}

/// Network connection parameters of one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetworkParameters {
    /// Bit 15/31: redundant owner (false is exclusive owner).
    pub redundant_owner: bool,
    pub connection_type: ConnectionType,
    pub priority: Priority,
    /// Bit 9/25: variable size (false is fixed).
    pub variable_size: bool,
    /// Connection size in bytes: 9 bits in Forward Open, 16 in Large Forward Open.
    pub size: u16,
}

impl NetworkParameters {
    /// The 16-bit Forward Open form; sizes above 511 do not fit.
    pub fn encode16(&self) -> Result<u16, CoreError> {
        if self.size > 0x1FF {
            return Err(invalid(format!(
                "connection size {} does not fit Forward Open's 9 bits",
                self.size
            )));
        }
        Ok((u32::from(self.redundant_owner) << 15
            | self.connection_type.bits() << 13
            | self.priority.bits() << 10
            | u32::from(self.variable_size) << 9
            | u32::from(self.size)) as u16)
    }

    /// The 32-bit Large Forward Open form.
    pub fn encode32(&self) -> u32 {
        u32::from(self.redundant_owner) << 31
            | self.connection_type.bits() << 29
            | self.priority.bits() << 26
            | u32::from(self.variable_size) << 25
            | u32::from(self.size)
    }

    pub fn decode16(word: u16) -> Result<Self, CoreError> {
        let w = u32::from(word);
        Ok(Self {
            redundant_owner: w >> 15 & 1 == 1,
            connection_type: ConnectionType::from_bits(w >> 13 & 3)?,
            priority: Priority::from_bits(w >> 10),
            variable_size: w >> 9 & 1 == 1,
            size: (w & 0x1FF) as u16,
        })
    }

    pub fn decode32(word: u32) -> Result<Self, CoreError> {
        Ok(Self {
            redundant_owner: word >> 31 & 1 == 1,
            connection_type: ConnectionType::from_bits(word >> 29 & 3)?,
            priority: Priority::from_bits(word >> 26),
            variable_size: word >> 25 & 1 == 1,
            size: (word & 0xFFFF) as u16,
        })
    }
}

/// Production trigger, bits 6-4 of the transport type/trigger byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Cyclic,
    ChangeOfState,
    Application,
}

/// The transport type/trigger byte: bit 7 direction (server), bits 6-4 trigger, 3-0 class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransportTrigger {
    /// Direction bit: false is client (the originator's usual choice), true is server.
    pub server: bool,
    pub trigger: Trigger,
    /// Transport class 0..=15; class-1 I/O is 1.
    pub class: u8,
}

impl TransportTrigger {
    /// Class 1, cyclic, client: the class-1 I/O an originator opens.
    pub const CLASS1_CYCLIC: Self = Self {
        server: false,
        trigger: Trigger::Cyclic,
        class: 1,
    };

    pub fn encode(&self) -> Result<u8, CoreError> {
        if self.class > 0x0F {
            return Err(invalid(format!("transport class {} above 15", self.class)));
        }
        let trigger = match self.trigger {
            Trigger::Cyclic => 0,
            Trigger::ChangeOfState => 1,
            Trigger::Application => 2,
        };
        Ok(u8::from(self.server) << 7 | trigger << 4 | self.class)
    }

    pub fn decode(byte: u8) -> Result<Self, CoreError> {
        let trigger = match byte >> 4 & 7 {
            0 => Trigger::Cyclic,
            1 => Trigger::ChangeOfState,
            2 => Trigger::Application,
            other => return Err(invalid(format!("production trigger {other} is reserved"))),
        };
        Ok(Self {
            server: byte & 0x80 != 0,
            trigger,
            class: byte & 0x0F,
        })
    }
}

/// Electronic key segment (0x34, key format 4): the target must match what is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElectronicKey {
    pub vendor_id: u16,
    pub device_type: u16,
    pub product_code: u16,
    /// Bit 7 of the major revision byte: accept a compatible device.
    pub compatibility: bool,
    /// 0..=127.
    pub major_revision: u8,
    pub minor_revision: u8,
}

/// Connection path to an assembly: optional key, class 0x04, the configuration instance,
/// then the O->T (output, consumed by the target) and T->O (input) connection points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionPath {
    pub key: Option<ElectronicKey>,
    pub config: u16,
    pub output: u16,
    pub input: u16,
}

/// An 8-bit logical segment, or the 16-bit form (format bit set, pad byte) above 255.
fn push_logical(out: &mut Vec<u8>, segment8: u8, value: u16) {
    if let Ok(byte) = u8::try_from(value) {
        out.extend_from_slice(&[segment8, byte]);
    } else {
        out.extend_from_slice(&[segment8 | 1, 0]);
        out.extend_from_slice(&value.to_le_bytes());
    }
}

fn read_logical(r: &mut Reader<'_>, segment8: u8, what: &str) -> Result<u16, CoreError> {
    let seg = r.u8()?;
    if seg == segment8 {
        Ok(u16::from(r.u8()?))
    } else if seg == segment8 | 1 {
        r.u8()?; // pad
        r.u16()
    } else {
        Err(invalid(format!(
            "connection path: expected {what} segment 0x{segment8:02X}, got 0x{seg:02X}"
        )))
    }
}

impl ConnectionPath {
    /// The path bytes, always a whole number of 16-bit words.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), CoreError> {
        if let Some(k) = &self.key {
            if k.major_revision > 0x7F {
                return Err(invalid(format!(
                    "electronic key major revision {} above 127",
                    k.major_revision
                )));
            }
            out.extend_from_slice(&[0x34, 0x04]);
            out.extend_from_slice(&k.vendor_id.to_le_bytes());
            out.extend_from_slice(&k.device_type.to_le_bytes());
            out.extend_from_slice(&k.product_code.to_le_bytes());
            out.push(u8::from(k.compatibility) << 7 | k.major_revision);
            out.push(k.minor_revision);
        }
        out.extend_from_slice(&[0x20, ASSEMBLY_CLASS]);
        push_logical(out, 0x24, self.config);
        push_logical(out, 0x2C, self.output);
        push_logical(out, 0x2C, self.input);
        Ok(())
    }

    /// Parses exactly the form [`encode`](Self::encode) writes.
    pub fn decode(bytes: &[u8]) -> Result<Self, CoreError> {
        let mut r = Reader::new(bytes, "connection path");
        let key = if bytes.first() == Some(&0x34) {
            r.u8()?;
            let format = r.u8()?;
            if format != 0x04 {
                return Err(invalid(format!(
                    "electronic key format {format} (only 4 is supported)"
                )));
            }
            let vendor_id = r.u16()?;
            let device_type = r.u16()?;
            let product_code = r.u16()?;
            let major = r.u8()?;
            let minor_revision = r.u8()?;
            Some(ElectronicKey {
                vendor_id,
                device_type,
                product_code,
                compatibility: major & 0x80 != 0,
                major_revision: major & 0x7F,
                minor_revision,
            })
        } else {
            None
        };
        let class = read_logical(&mut r, 0x20, "class")?;
        if class != u16::from(ASSEMBLY_CLASS) {
            return Err(invalid(format!(
                "connection path class 0x{class:02X}, expected the assembly class 0x04"
            )));
        }
        let config = read_logical(&mut r, 0x24, "instance")?;
        let output = read_logical(&mut r, 0x2C, "connection point")?;
        let input = read_logical(&mut r, 0x2C, "connection point")?;
        r.finish()?;
        Ok(Self {
            key,
            config,
            output,
            input,
        })
    }
}

fn path_words(path: &[u8]) -> Result<u8, CoreError> {
    u8::try_from(path.len() / 2).map_err(|_| invalid("connection path longer than 255 words"))
}

fn read_request_header(r: &mut Reader<'_>, services: &[u8]) -> Result<u8, CoreError> {
    let service = r.u8()?;
    if !services.contains(&service) {
        return Err(invalid(format!(
            "service 0x{service:02X}, expected one of {services:02X?}"
        )));
    }
    let words = r.u8()?;
    let path = r.take(usize::from(words) * 2)?;
    if path != CONNECTION_MANAGER_PATH {
        return Err(invalid(format!(
            "request path {path:02X?} is not the Connection Manager (20 06 24 01)"
        )));
    }
    Ok(service)
}

/// A Forward Open request; the encoder picks Large Forward Open when a size needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardOpenRequest {
    /// Bit 4 priority, bits 3-0 tick time: one tick is 2^n ms.
    pub priority_time_tick: u8,
    /// Unconnected-request timeout in ticks.
    pub timeout_ticks: u8,
    /// Proposed by the originator; the target chooses its own for point-to-point O->T.
    pub o2t_connection_id: u32,
    pub t2o_connection_id: u32,
    pub connection_serial: u16,
    pub originator_vendor_id: u16,
    pub originator_serial: u32,
    /// Encoded 0..=7 for x4, x8, ... x512.
    pub timeout_multiplier: u8,
    pub o2t_rpi_us: u32,
    pub o2t: NetworkParameters,
    pub t2o_rpi_us: u32,
    pub t2o: NetworkParameters,
    pub transport: TransportTrigger,
    pub path: ConnectionPath,
}

impl ForwardOpenRequest {
    /// Large Forward Open when either connection size exceeds [`MAX_SMALL_CONNECTION_SIZE`].
    pub fn is_large(&self) -> bool {
        self.o2t.size > MAX_SMALL_CONNECTION_SIZE || self.t2o.size > MAX_SMALL_CONNECTION_SIZE
    }

    /// The watchdog factor the encoded multiplier stands for (4 << n).
    pub fn multiplier_factor(&self) -> u32 {
        4u32 << self.timeout_multiplier.min(7)
    }

    /// Appends the whole Message Router request (service, path, data) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), CoreError> {
        if self.timeout_multiplier > 7 {
            return Err(invalid(format!(
                "timeout multiplier {} above 7 (x512)",
                self.timeout_multiplier
            )));
        }
        let large = self.is_large();
        let mut path = Vec::with_capacity(24);
        self.path.encode(&mut path)?;
        let words = path_words(&path)?;
        let transport = self.transport.encode()?;
        out.push(if large {
            SERVICE_LARGE_FORWARD_OPEN
        } else {
            SERVICE_FORWARD_OPEN
        });
        out.push(2);
        out.extend_from_slice(&CONNECTION_MANAGER_PATH);
        out.extend_from_slice(&[self.priority_time_tick, self.timeout_ticks]);
        out.extend_from_slice(&self.o2t_connection_id.to_le_bytes());
        out.extend_from_slice(&self.t2o_connection_id.to_le_bytes());
        out.extend_from_slice(&self.connection_serial.to_le_bytes());
        out.extend_from_slice(&self.originator_vendor_id.to_le_bytes());
        out.extend_from_slice(&self.originator_serial.to_le_bytes());
        out.extend_from_slice(&[self.timeout_multiplier, 0, 0, 0]);
        for (rpi, params) in [(self.o2t_rpi_us, &self.o2t), (self.t2o_rpi_us, &self.t2o)] {
            out.extend_from_slice(&rpi.to_le_bytes());
            if large {
                out.extend_from_slice(&params.encode32().to_le_bytes());
            } else {
                out.extend_from_slice(&params.encode16()?.to_le_bytes());
            }
        }
        out.extend_from_slice(&[transport, words]);
        out.extend_from_slice(&path);
        Ok(())
    }

    /// Parses a Forward Open or Large Forward Open request (for the target side and tests).
    pub fn decode(bytes: &[u8]) -> Result<Self, CoreError> {
        let mut r = Reader::new(bytes, "forward open request");
        let service =
            read_request_header(&mut r, &[SERVICE_FORWARD_OPEN, SERVICE_LARGE_FORWARD_OPEN])?;
        let large = service == SERVICE_LARGE_FORWARD_OPEN;
        let priority_time_tick = r.u8()?;
        let timeout_ticks = r.u8()?;
        let o2t_connection_id = r.u32()?;
        let t2o_connection_id = r.u32()?;
        let connection_serial = r.u16()?;
        let originator_vendor_id = r.u16()?;
        let originator_serial = r.u32()?;
        let timeout_multiplier = r.u8()?;
        r.take(3)?;
        let read_direction = |r: &mut Reader<'_>| -> Result<_, CoreError> {
            let rpi = r.u32()?;
            let params = if large {
                NetworkParameters::decode32(r.u32()?)?
            } else {
                NetworkParameters::decode16(r.u16()?)?
            };
            Ok((rpi, params))
        };
        let (o2t_rpi_us, o2t) = read_direction(&mut r)?;
        let (t2o_rpi_us, t2o) = read_direction(&mut r)?;
        let transport = TransportTrigger::decode(r.u8()?)?;
        let words = r.u8()?;
        let path = ConnectionPath::decode(r.take(usize::from(words) * 2)?)?;
        r.finish()?;
        Ok(Self {
            priority_time_tick,
            timeout_ticks,
            o2t_connection_id,
            t2o_connection_id,
            connection_serial,
            originator_vendor_id,
            originator_serial,
            timeout_multiplier,
            o2t_rpi_us,
            o2t,
            t2o_rpi_us,
            t2o,
            transport,
            path,
        })
    }
}

/// A Forward Close request (0x4E): the triad that names the connection, and its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardCloseRequest {
    pub priority_time_tick: u8,
    pub timeout_ticks: u8,
    pub connection_serial: u16,
    pub originator_vendor_id: u16,
    pub originator_serial: u32,
    pub path: ConnectionPath,
}

impl ForwardCloseRequest {
    /// Appends the whole Message Router request to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), CoreError> {
        let mut path = Vec::with_capacity(24);
        self.path.encode(&mut path)?;
        let words = path_words(&path)?;
        out.extend_from_slice(&[SERVICE_FORWARD_CLOSE, 2]);
        out.extend_from_slice(&CONNECTION_MANAGER_PATH);
        out.extend_from_slice(&[self.priority_time_tick, self.timeout_ticks]);
        out.extend_from_slice(&self.connection_serial.to_le_bytes());
        out.extend_from_slice(&self.originator_vendor_id.to_le_bytes());
        out.extend_from_slice(&self.originator_serial.to_le_bytes());
        out.extend_from_slice(&[words, 0]);
        out.extend_from_slice(&path);
        Ok(())
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, CoreError> {
        let mut r = Reader::new(bytes, "forward close request");
        read_request_header(&mut r, &[SERVICE_FORWARD_CLOSE])?;
        let priority_time_tick = r.u8()?;
        let timeout_ticks = r.u8()?;
        let connection_serial = r.u16()?;
        let originator_vendor_id = r.u16()?;
        let originator_serial = r.u32()?;
        let words = r.u8()?;
        r.u8()?;
        let path = ConnectionPath::decode(r.take(usize::from(words) * 2)?)?;
        r.finish()?;
        Ok(Self {
            priority_time_tick,
            timeout_ticks,
            connection_serial,
            originator_vendor_id,
            originator_serial,
            path,
        })
    }
}

/// The success data of a (Large) Forward Open reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardOpenSuccess {
    /// True for a Large Forward Open reply (0xDB).
    pub large: bool,
    pub o2t_connection_id: u32,
    pub t2o_connection_id: u32,
    pub connection_serial: u16,
    pub originator_vendor_id: u16,
    pub originator_serial: u32,
    /// Actual packet intervals the target granted; they govern the run.
    pub o2t_api_us: u32,
    pub t2o_api_us: u32,
    /// Application reply data, a whole number of words.
    pub application_reply: Vec<u8>,
}

/// A refused connection service: general status, additional status words, and the
/// connection triad and remaining path size when the target sent them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionFailure {
    /// The reply service byte (0xD4, 0xDB or 0xCE).
    pub service: u8,
    pub general: u8,
    pub additional: Vec<u16>,
    /// (connection serial, originator vendor id, originator serial).
    pub triad: Option<(u16, u16, u32)>,
    pub remaining_path_size: Option<u8>,
}

impl ConnectionFailure {
    /// The extended status: the first additional status word.
    pub fn extended(&self) -> Option<u16> {
        self.additional.first().copied()
    }

    pub fn name(&self) -> &'static str {
        status_name(self.general, self.extended())
    }

    /// Codes and name for logs and `sb/status`, e.g. `0x01/0x0100 connection in use ...`.
    pub fn describe(&self) -> String {
        describe_status(self.general, self.extended())
    }

    /// Appends the whole reply to `out` (for the target side and tests).
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), CoreError> {
        let words = u8::try_from(self.additional.len())
            .map_err(|_| invalid("more than 255 additional status words"))?;
        if self.general == 0 {
            return Err(invalid("a failure needs a non-zero general status"));
        }
        out.extend_from_slice(&[self.service, 0, self.general, words]);
        for w in &self.additional {
            out.extend_from_slice(&w.to_le_bytes());
        }
        if let Some((serial, vendor, orig)) = self.triad {
            out.extend_from_slice(&serial.to_le_bytes());
            out.extend_from_slice(&vendor.to_le_bytes());
            out.extend_from_slice(&orig.to_le_bytes());
            if let Some(remaining) = self.remaining_path_size {
                out.extend_from_slice(&[remaining, 0]);
            }
        }
        Ok(())
    }
}

/// A decoded (Large) Forward Open reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForwardOpenReply {
    Opened(ForwardOpenSuccess),
    Refused(ConnectionFailure),
}

/// A decoded Forward Close reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForwardCloseReply {
    Closed(ForwardCloseSuccess),
    Refused(ConnectionFailure),
}

/// The success data of a Forward Close reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardCloseSuccess {
    pub connection_serial: u16,
    pub originator_vendor_id: u16,
    pub originator_serial: u32,
    pub application_reply: Vec<u8>,
}

/// Reads the reply header; answers (service, general status, additional status words).
fn read_reply_header(r: &mut Reader<'_>, services: &[u8]) -> Result<(u8, u8, Vec<u16>), CoreError> {
    let service = r.u8()?;
    if !services.contains(&service) {
        return Err(invalid(format!(
            "reply service 0x{service:02X}, expected one of {services:02X?}"
        )));
    }
    r.u8()?; // reserved
    let general = r.u8()?;
    let words = r.u8()?;
    let mut additional = Vec::with_capacity(usize::from(words));
    for _ in 0..words {
        additional.push(r.u16()?);
    }
    Ok((service, general, additional))
}

/// The error data after a failure's status: lenient, since targets differ in how much
/// of the triad and remaining path size they send.
fn read_failure(
    r: &mut Reader<'_>,
    service: u8,
    general: u8,
    additional: Vec<u16>,
) -> ConnectionFailure {
    let mut triad = None;
    let mut remaining_path_size = None;
    if r.remaining() >= 8 {
        if let (Ok(serial), Ok(vendor), Ok(orig)) = (r.u16(), r.u16(), r.u32()) {
            triad = Some((serial, vendor, orig));
            if r.remaining() >= 1 {
                remaining_path_size = r.u8().ok();
            }
        }
    }
    r.rest();
    ConnectionFailure {
        service,
        general,
        additional,
        triad,
        remaining_path_size,
    }
}

fn read_application_reply(r: &mut Reader<'_>) -> Result<Vec<u8>, CoreError> {
    let words = r.u8()?;
    r.u8()?; // reserved
    let data = r.take(usize::from(words) * 2)?.to_vec();
    r.finish()?;
    Ok(data)
}

impl ForwardOpenReply {
    /// Decodes a Forward Open (0xD4) or Large Forward Open (0xDB) reply.
    pub fn decode(bytes: &[u8]) -> Result<Self, CoreError> {
        let mut r = Reader::new(bytes, "forward open reply");
        let services = [
            SERVICE_FORWARD_OPEN | REPLY_BIT,
            SERVICE_LARGE_FORWARD_OPEN | REPLY_BIT,
        ];
        let (service, general, additional) = read_reply_header(&mut r, &services)?;
        if general != 0 {
            return Ok(Self::Refused(read_failure(
                &mut r, service, general, additional,
            )));
        }
        let o2t_connection_id = r.u32()?;
        let t2o_connection_id = r.u32()?;
        let connection_serial = r.u16()?;
        let originator_vendor_id = r.u16()?;
        let originator_serial = r.u32()?;
        let o2t_api_us = r.u32()?;
        let t2o_api_us = r.u32()?;
        let application_reply = read_application_reply(&mut r)?;
        Ok(Self::Opened(ForwardOpenSuccess {
            large: service == SERVICE_LARGE_FORWARD_OPEN | REPLY_BIT,
            o2t_connection_id,
            t2o_connection_id,
            connection_serial,
            originator_vendor_id,
            originator_serial,
            o2t_api_us,
            t2o_api_us,
            application_reply,
        }))
    }
}

fn application_words(data: &[u8]) -> Result<u8, CoreError> {
    if !data.len().is_multiple_of(2) {
        return Err(invalid("application reply data must be whole 16-bit words"));
    }
    u8::try_from(data.len() / 2).map_err(|_| invalid("application reply above 255 words"))
}

impl ForwardOpenSuccess {
    /// Appends the whole success reply to `out` (for the target side and tests).
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), CoreError> {
        let words = application_words(&self.application_reply)?;
        let service = if self.large {
            SERVICE_LARGE_FORWARD_OPEN
        } else {
            SERVICE_FORWARD_OPEN
        };
        out.extend_from_slice(&[service | REPLY_BIT, 0, 0, 0]);
        out.extend_from_slice(&self.o2t_connection_id.to_le_bytes());
        out.extend_from_slice(&self.t2o_connection_id.to_le_bytes());
        out.extend_from_slice(&self.connection_serial.to_le_bytes());
        out.extend_from_slice(&self.originator_vendor_id.to_le_bytes());
        out.extend_from_slice(&self.originator_serial.to_le_bytes());
        out.extend_from_slice(&self.o2t_api_us.to_le_bytes());
        out.extend_from_slice(&self.t2o_api_us.to_le_bytes());
        out.extend_from_slice(&[words, 0]);
        out.extend_from_slice(&self.application_reply);
        Ok(())
    }
}

impl ForwardCloseReply {
    /// Decodes a Forward Close reply (0xCE).
    pub fn decode(bytes: &[u8]) -> Result<Self, CoreError> {
        let mut r = Reader::new(bytes, "forward close reply");
        let (service, general, additional) =
            read_reply_header(&mut r, &[SERVICE_FORWARD_CLOSE | REPLY_BIT])?;
        if general != 0 {
            return Ok(Self::Refused(read_failure(
                &mut r, service, general, additional,
            )));
        }
        let connection_serial = r.u16()?;
        let originator_vendor_id = r.u16()?;
        let originator_serial = r.u32()?;
        let application_reply = read_application_reply(&mut r)?;
        Ok(Self::Closed(ForwardCloseSuccess {
            connection_serial,
            originator_vendor_id,
            originator_serial,
            application_reply,
        }))
    }
}

impl ForwardCloseSuccess {
    /// Appends the whole success reply to `out` (for the target side and tests).
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), CoreError> {
        let words = application_words(&self.application_reply)?;
        out.extend_from_slice(&[SERVICE_FORWARD_CLOSE | REPLY_BIT, 0, 0, 0]);
        out.extend_from_slice(&self.connection_serial.to_le_bytes());
        out.extend_from_slice(&self.originator_vendor_id.to_le_bytes());
        out.extend_from_slice(&self.originator_serial.to_le_bytes());
        out.extend_from_slice(&[words, 0]);
        out.extend_from_slice(&self.application_reply);
        Ok(())
    }
}

/// Connection Manager extended status names (general status 0x01), as Wireshark names them.
pub const EXTENDED_STATUS_NAMES: [(u16, &str); 20] = [
    (0x0100, "connection in use or duplicate forward open"),
    (
        0x0103,
        "transport class and trigger combination not supported",
    ),
    (0x0106, "ownership conflict"),
    (0x0107, "target connection not found"),
    (0x0108, "invalid network connection parameter"),
    (0x0109, "invalid connection size"),
    (0x0110, "target for connection not configured"),
    (0x0111, "RPI not supported"),
    (0x0113, "out of connections"),
    (0x0114, "vendor id or product code mismatch"),
    (0x0115, "product type mismatch"),
    (0x0116, "revision mismatch"),
    (0x0117, "invalid produced or consumed application path"),
    (
        0x0118,
        "invalid or inconsistent configuration application path",
    ),
    (0x0119, "non-listen only connection not opened"),
    (0x011A, "target object out of connections"),
    (0x011B, "RPI smaller than production inhibit time"),
    (0x0203, "connection timed out"),
    (0x0204, "unconnected request timed out"),
    (0x0315, "invalid segment in connection path"),
];

/// General status names other than connection failure (CIP Vol 1, appendix B).
pub const GENERAL_STATUS_NAMES: [(u8, &str); 12] = [
    (0x00, "success"),
    (0x02, "resource unavailable"),
    (0x04, "path segment error"),
    (0x05, "path destination unknown"),
    (0x08, "service not supported"),
    (0x09, "invalid attribute value"),
    (0x0C, "object state conflict"),
    (0x10, "device state conflict"),
    (0x11, "reply data too large"),
    (0x13, "not enough data"),
    (0x15, "too much data"),
    (0x1E, "embedded service error"),
];

pub const UNKNOWN_CONNECTION_FAILURE: &str = "connection failure (unknown extended status)";
pub const UNKNOWN_GENERAL_STATUS: &str = "unknown general status";

/// The name of a connection service status; unknown codes get a generic name.
pub fn status_name(general: u8, extended: Option<u16>) -> &'static str {
    if general == GENERAL_CONNECTION_FAILURE {
        return extended
            .and_then(|e| EXTENDED_STATUS_NAMES.iter().find(|(c, _)| *c == e))
            .map_or(UNKNOWN_CONNECTION_FAILURE, |(_, n)| n);
    }
    GENERAL_STATUS_NAMES
        .iter()
        .find(|(c, _)| *c == general)
        .map_or(UNKNOWN_GENERAL_STATUS, |(_, n)| n)
}

/// `0xGG[/0xEEEE] name`: the codes in hex, so an unknown code is still identifiable.
pub fn describe_status(general: u8, extended: Option<u16>) -> String {
    let name = status_name(general, extended);
    match extended {
        Some(e) => format!("0x{general:02X}/0x{e:04X} {name}"),
        None => format!("0x{general:02X} {name}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn params(connection_type: ConnectionType, size: u16) -> NetworkParameters {
        NetworkParameters {
            redundant_owner: false,
            connection_type,
            priority: Priority::Scheduled,
            variable_size: false,
            size,
        }
    }

    fn request() -> ForwardOpenRequest {
        ForwardOpenRequest {
            priority_time_tick: 0x0A,
            timeout_ticks: 0x0E,
            o2t_connection_id: 0x1122_3344,
            t2o_connection_id: 0x5566_7788,
            connection_serial: 0x1234,
            originator_vendor_id: 0x0001,
            originator_serial: 0xDEAD_BEEF,
            timeout_multiplier: 2,
            o2t_rpi_us: 10_000,
            o2t: params(ConnectionType::PointToPoint, 38),
            t2o_rpi_us: 20_000,
            t2o: params(ConnectionType::Multicast, 70),
            transport: TransportTrigger::CLASS1_CYCLIC,
            path: ConnectionPath {
                key: None,
                config: 151,
                output: 150,
                input: 100,
            },
        }
    }

    fn encoded(req: &ForwardOpenRequest) -> Vec<u8> {
        let mut out = Vec::new();
        req.encode(&mut out).unwrap();
        out
    }

    // Forward Open, CIP Vol 1 3-5.5.2, by hand:
    //   54                 service Forward Open
    //   02 20 06 24 01     path: 2 words, class 0x06 instance 1 (Connection Manager)
    //   0A 0E              priority/time tick 0x0A, timeout ticks 14
    //   44 33 22 11        O->T connection id 0x11223344
    //   88 77 66 55        T->O connection id 0x55667788
    //   34 12              connection serial 0x1234
    //   01 00              originator vendor 1
    //   EF BE AD DE        originator serial 0xDEADBEEF
    //   02 00 00 00        timeout multiplier 2 (x16), 3 reserved
    //   10 27 00 00        O->T RPI 10000 us
    //   26 48              O->T params: p2p (2<<13) | scheduled (2<<10) | fixed | 38 = 0x4826
    //   20 4E 00 00        T->O RPI 20000 us
    //   46 28              T->O params: multicast (1<<13) | scheduled | fixed | 70 = 0x2846
    //   01                 transport: client, cyclic, class 1
    //   04                 connection path: 4 words
    //   20 04 24 97 2C 96 2C 64   assembly class, config 151, output 150, input 100
    const FORWARD_OPEN: [u8; 50] = [
        0x54, 0x02, 0x20, 0x06, 0x24, 0x01, 0x0A, 0x0E, 0x44, 0x33, 0x22, 0x11, 0x88, 0x77, 0x66,
        0x55, 0x34, 0x12, 0x01, 0x00, 0xEF, 0xBE, 0xAD, 0xDE, 0x02, 0x00, 0x00, 0x00, 0x10, 0x27,
        0x00, 0x00, 0x26, 0x48, 0x20, 0x4E, 0x00, 0x00, 0x46, 0x28, 0x01, 0x04, 0x20, 0x04, 0x24,
        0x97, 0x2C, 0x96, 0x2C, 0x64,
    ];

    #[test]
    fn forward_open_matches_the_hand_layout_and_round_trips() {
        let req = request();
        assert!(!req.is_large());
        assert_eq!(req.multiplier_factor(), 16);
        assert_eq!(encoded(&req), FORWARD_OPEN);
        assert_eq!(ForwardOpenRequest::decode(&FORWARD_OPEN).unwrap(), req);
    }

    // Large Forward Open: the same request with a 600-byte O->T size, a 16-bit output
    // connection point 0x0300 and an electronic key; what changes, by hand:
    //   5B                 service Large Forward Open
    //   10 27 00 00 58 02 00 48   O->T RPI, params 0x48000258: p2p (2<<29) | scheduled (2<<26) | 600
    //   20 4E 00 00 46 00 00 28   T->O RPI, params 0x28000046: multicast (1<<29) | scheduled | 70
    //   01 0A              transport, path 10 words
    //   34 04 01 00 0C 00 2A 00 83 05   key format 4: vendor 1, type 12, product 42, compat major 3, minor 5
    //   20 04 24 97 2D 00 00 03 2C 64   config 151, output 0x0300 (16-bit segment, pad), input 100
    #[test]
    fn large_forward_open_when_a_size_exceeds_505() {
        let mut req = request();
        req.o2t.size = 600;
        req.path.output = 0x0300;
        req.path.key = Some(ElectronicKey {
            vendor_id: 1,
            device_type: 12,
            product_code: 42,
            compatibility: true,
            major_revision: 3,
            minor_revision: 5,
        });
        assert!(req.is_large());
        let wire = encoded(&req);
        assert_eq!(wire[0], 0x5B);
        assert_eq!(&wire[1..28], &FORWARD_OPEN[1..28]);
        let tail: [u8; 38] = [
            0x10, 0x27, 0x00, 0x00, 0x58, 0x02, 0x00, 0x48, 0x20, 0x4E, 0x00, 0x00, 0x46, 0x00,
            0x00, 0x28, 0x01, 0x0A, 0x34, 0x04, 0x01, 0x00, 0x0C, 0x00, 0x2A, 0x00, 0x83, 0x05,
            0x20, 0x04, 0x24, 0x97, 0x2D, 0x00, 0x00, 0x03, 0x2C, 0x64,
        ];
        assert_eq!(&wire[28..], &tail);
        assert_eq!(ForwardOpenRequest::decode(&wire).unwrap(), req);
    }

    #[test]
    fn the_large_threshold_is_505_on_either_direction() {
        for (o2t, t2o, large) in [
            (505, 505, false),
            (506, 10, true),
            (10, 506, true),
            (0, 0, false),
        ] {
            let mut req = request();
            req.o2t.size = o2t;
            req.t2o.size = t2o;
            assert_eq!(req.is_large(), large, "{o2t} {t2o}");
            let wire = encoded(&req);
            assert_eq!(wire[0] == SERVICE_LARGE_FORWARD_OPEN, large);
            assert_eq!(ForwardOpenRequest::decode(&wire).unwrap(), req);
        }
    }

    #[test]
    fn bad_requests_are_refused() {
        let mut req = request();
        req.timeout_multiplier = 8;
        assert!(req.encode(&mut Vec::new()).is_err());
        let mut req = request();
        req.transport.class = 16;
        assert!(req.encode(&mut Vec::new()).is_err());
        assert!(params(ConnectionType::Null, 512).encode16().is_err());
        assert!(NetworkParameters::decode16(0x6000).is_err());
        let mut wrong_path = FORWARD_OPEN;
        wrong_path[3] = 0x07;
        assert!(ForwardOpenRequest::decode(&wrong_path).is_err());
        let mut wrong_class = FORWARD_OPEN;
        wrong_class[43] = 0x05;
        assert!(ForwardOpenRequest::decode(&wrong_class).is_err());
    }

    // Forward Open success reply, by hand:
    //   D4 00 00 00        reply to 0x54, reserved, general 0, no additional status
    //   01 00 FE 7F        O->T connection id chosen by the target 0x7FFE0001
    //   88 77 66 55        T->O connection id
    //   34 12 01 00 EF BE AD DE   serial, vendor, originator serial (echoed)
    //   10 27 00 00        O->T API 10000 us
    //   40 9C 00 00        T->O API 40000 us (the target slowed it)
    //   01 00 AA BB        application reply: 1 word, reserved, data
    const FORWARD_OPEN_REPLY: [u8; 32] = [
        0xD4, 0x00, 0x00, 0x00, 0x01, 0x00, 0xFE, 0x7F, 0x88, 0x77, 0x66, 0x55, 0x34, 0x12, 0x01,
        0x00, 0xEF, 0xBE, 0xAD, 0xDE, 0x10, 0x27, 0x00, 0x00, 0x40, 0x9C, 0x00, 0x00, 0x01, 0x00,
        0xAA, 0xBB,
    ];

    fn success() -> ForwardOpenSuccess {
        ForwardOpenSuccess {
            large: false,
            o2t_connection_id: 0x7FFE_0001,
            t2o_connection_id: 0x5566_7788,
            connection_serial: 0x1234,
            originator_vendor_id: 1,
            originator_serial: 0xDEAD_BEEF,
            o2t_api_us: 10_000,
            t2o_api_us: 40_000,
            application_reply: vec![0xAA, 0xBB],
        }
    }

    #[test]
    fn forward_open_success_reply_decodes_and_round_trips() {
        let wire = &FORWARD_OPEN_REPLY[..];
        assert_eq!(
            ForwardOpenReply::decode(wire).unwrap(),
            ForwardOpenReply::Opened(success())
        );
        let mut out = Vec::new();
        success().encode(&mut out).unwrap();
        assert_eq!(out, wire);
        // Trailing bytes after the application data are malformed.
        let mut trailing = FORWARD_OPEN_REPLY.to_vec();
        trailing.extend_from_slice(&[0, 0]);
        assert!(ForwardOpenReply::decode(&trailing).is_err());
        let mut large = success();
        large.large = true;
        large.application_reply.clear();
        let mut out = Vec::new();
        large.encode(&mut out).unwrap();
        assert_eq!(out[0], 0xDB);
        assert_eq!(
            ForwardOpenReply::decode(&out).unwrap(),
            ForwardOpenReply::Opened(large)
        );
    }

    // Forward Open refused, by hand:
    //   D4 00 01 01        general 0x01 connection failure, 1 additional word
    //   09 01              extended 0x0109 invalid connection size
    //   34 12 01 00 EF BE AD DE   serial, vendor, originator serial
    //   00 00              remaining path size 0, reserved
    const FORWARD_OPEN_REFUSED: [u8; 16] = [
        0xD4, 0x00, 0x01, 0x01, 0x09, 0x01, 0x34, 0x12, 0x01, 0x00, 0xEF, 0xBE, 0xAD, 0xDE, 0x00,
        0x00,
    ];

    #[test]
    fn forward_open_error_reply_decodes_with_its_status_name() {
        let ForwardOpenReply::Refused(f) = ForwardOpenReply::decode(&FORWARD_OPEN_REFUSED).unwrap()
        else {
            panic!("expected a refusal");
        };
        assert_eq!((f.general, f.extended()), (0x01, Some(0x0109)));
        assert_eq!(f.triad, Some((0x1234, 1, 0xDEAD_BEEF)));
        assert_eq!(f.remaining_path_size, Some(0));
        assert_eq!(f.name(), "invalid connection size");
        assert_eq!(f.describe(), "0x01/0x0109 invalid connection size");
        let mut out = Vec::new();
        f.encode(&mut out).unwrap();
        assert_eq!(out, FORWARD_OPEN_REFUSED);
        // A bare refusal (status only) still decodes, without the triad.
        let bare = ForwardOpenReply::decode(&FORWARD_OPEN_REFUSED[..6]).unwrap();
        assert!(matches!(
            bare,
            ForwardOpenReply::Refused(ConnectionFailure { triad: None, .. })
        ));
    }

    #[test]
    fn every_status_name_row() {
        let table: [(u8, Option<u16>, &str); 25] = [
            (
                0x01,
                Some(0x0100),
                "connection in use or duplicate forward open",
            ),
            (
                0x01,
                Some(0x0103),
                "transport class and trigger combination not supported",
            ),
            (0x01, Some(0x0106), "ownership conflict"),
            (0x01, Some(0x0107), "target connection not found"),
            (0x01, Some(0x0108), "invalid network connection parameter"),
            (0x01, Some(0x0109), "invalid connection size"),
            (0x01, Some(0x0110), "target for connection not configured"),
            (0x01, Some(0x0111), "RPI not supported"),
            (0x01, Some(0x0113), "out of connections"),
            (0x01, Some(0x0114), "vendor id or product code mismatch"),
            (0x01, Some(0x0115), "product type mismatch"),
            (0x01, Some(0x0116), "revision mismatch"),
            (
                0x01,
                Some(0x0117),
                "invalid produced or consumed application path",
            ),
            (
                0x01,
                Some(0x0118),
                "invalid or inconsistent configuration application path",
            ),
            (0x01, Some(0x0119), "non-listen only connection not opened"),
            (0x01, Some(0x011A), "target object out of connections"),
            (
                0x01,
                Some(0x011B),
                "RPI smaller than production inhibit time",
            ),
            (0x01, Some(0x0203), "connection timed out"),
            (0x01, Some(0x0204), "unconnected request timed out"),
            (0x01, Some(0x0315), "invalid segment in connection path"),
            (0x01, Some(0x0999), UNKNOWN_CONNECTION_FAILURE),
            (0x01, None, UNKNOWN_CONNECTION_FAILURE),
            (0x08, None, "service not supported"),
            (0x00, None, "success"),
            (0x7E, Some(0x0100), UNKNOWN_GENERAL_STATUS),
        ];
        for (general, extended, name) in table {
            assert_eq!(
                status_name(general, extended),
                name,
                "{general:#x} {extended:?}"
            );
        }
        assert_eq!(
            describe_status(0x01, Some(0x0999)),
            "0x01/0x0999 connection failure (unknown extended status)"
        );
        assert_eq!(describe_status(0x7E, None), "0x7E unknown general status");
    }

    // Forward Close, CIP Vol 1 3-5.5.3, by hand:
    //   4E 02 20 06 24 01  service, Connection Manager path
    //   0A 0E              priority/time tick, timeout ticks
    //   34 12 01 00 EF BE AD DE   serial, vendor, originator serial
    //   04 00              connection path 4 words, reserved
    //   20 04 24 97 2C 96 2C 64
    const FORWARD_CLOSE: [u8; 26] = [
        0x4E, 0x02, 0x20, 0x06, 0x24, 0x01, 0x0A, 0x0E, 0x34, 0x12, 0x01, 0x00, 0xEF, 0xBE, 0xAD,
        0xDE, 0x04, 0x00, 0x20, 0x04, 0x24, 0x97, 0x2C, 0x96, 0x2C, 0x64,
    ];

    fn close() -> ForwardCloseRequest {
        let r = request();
        ForwardCloseRequest {
            priority_time_tick: r.priority_time_tick,
            timeout_ticks: r.timeout_ticks,
            connection_serial: r.connection_serial,
            originator_vendor_id: r.originator_vendor_id,
            originator_serial: r.originator_serial,
            path: r.path,
        }
    }

    #[test]
    fn forward_close_request_and_replies() {
        let mut out = Vec::new();
        close().encode(&mut out).unwrap();
        assert_eq!(out, FORWARD_CLOSE);
        assert_eq!(
            ForwardCloseRequest::decode(&FORWARD_CLOSE).unwrap(),
            close()
        );
        // Success: CE 00 00 00, serial, vendor, originator serial, 0 words, reserved.
        let ok = [
            0xCE, 0x00, 0x00, 0x00, 0x34, 0x12, 0x01, 0x00, 0xEF, 0xBE, 0xAD, 0xDE, 0x00, 0x00,
        ];
        let closed = ForwardCloseSuccess {
            connection_serial: 0x1234,
            originator_vendor_id: 1,
            originator_serial: 0xDEAD_BEEF,
            application_reply: vec![],
        };
        assert_eq!(
            ForwardCloseReply::decode(&ok).unwrap(),
            ForwardCloseReply::Closed(closed.clone())
        );
        let mut out = Vec::new();
        closed.encode(&mut out).unwrap();
        assert_eq!(out, ok);
        // Refused: 0x01/0x0107 target connection not found.
        let refused = [
            0xCE, 0x00, 0x01, 0x01, 0x07, 0x01, 0x34, 0x12, 0x01, 0x00, 0xEF, 0xBE, 0xAD, 0xDE,
            0x00, 0x00,
        ];
        let ForwardCloseReply::Refused(f) = ForwardCloseReply::decode(&refused).unwrap() else {
            panic!("expected a refusal");
        };
        assert_eq!(f.name(), "target connection not found");
        // A Forward Open reply is not a Forward Close reply, and vice versa.
        assert!(ForwardCloseReply::decode(&FORWARD_OPEN_REFUSED).is_err());
        assert!(ForwardOpenReply::decode(&refused).is_err());
    }

    #[test]
    fn truncated_inputs_at_every_length_are_errors() {
        let reply = &FORWARD_OPEN_REPLY[..];
        for n in 0..reply.len() {
            assert!(ForwardOpenReply::decode(&reply[..n]).is_err(), "reply {n}");
        }
        for n in 0..FORWARD_OPEN.len() {
            assert!(
                ForwardOpenRequest::decode(&FORWARD_OPEN[..n]).is_err(),
                "open {n}"
            );
        }
        for n in 0..FORWARD_CLOSE.len() {
            assert!(
                ForwardCloseRequest::decode(&FORWARD_CLOSE[..n]).is_err(),
                "close {n}"
            );
        }
        // A refusal's header (through its additional status) is required; the rest is optional.
        for n in 0..6 {
            assert!(
                ForwardOpenReply::decode(&FORWARD_OPEN_REFUSED[..n]).is_err(),
                "refused {n}"
            );
        }
        for n in 6..=FORWARD_OPEN_REFUSED.len() {
            assert!(
                ForwardOpenReply::decode(&FORWARD_OPEN_REFUSED[..n]).is_ok(),
                "refused {n}"
            );
        }
    }

    fn arb_params() -> impl Strategy<Value = NetworkParameters> {
        (any::<bool>(), 0u8..3, 0u8..4, any::<bool>(), any::<u16>()).prop_map(
            |(owner, ty, pri, var, size)| NetworkParameters {
                redundant_owner: owner,
                connection_type: ConnectionType::from_bits(u32::from(ty)).unwrap(),
                priority: Priority::from_bits(u32::from(pri)),
                variable_size: var,
                size,
            },
        )
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..96)) {
            let _ = ForwardOpenReply::decode(&bytes);
            let _ = ForwardCloseReply::decode(&bytes);
            let _ = ForwardOpenRequest::decode(&bytes);
            let _ = ForwardCloseRequest::decode(&bytes);
            let _ = ConnectionPath::decode(&bytes);
        }

        #[test]
        fn requests_round_trip(
            ids in any::<(u32, u32, u16, u16, u32)>(), mult in 0u8..8,
            rpis in any::<(u32, u32)>(), o2t in arb_params(), t2o in arb_params(),
            points in any::<(u16, u16, u16)>(), keyed in any::<bool>(),
        ) {
            let mut req = request();
            (req.o2t_connection_id, req.t2o_connection_id, req.connection_serial,
             req.originator_vendor_id, req.originator_serial) = ids;
            req.timeout_multiplier = mult;
            (req.o2t_rpi_us, req.t2o_rpi_us) = rpis;
            (req.o2t, req.t2o) = (o2t, t2o);
            (req.path.config, req.path.output, req.path.input) = points;
            if keyed {
                req.path.key = Some(ElectronicKey {
                    vendor_id: ids.3, device_type: 12, product_code: ids.2,
                    compatibility: mult % 2 == 0, major_revision: mult, minor_revision: 1,
                });
            }
            let wire = encoded(&req);
            prop_assert_eq!(ForwardOpenRequest::decode(&wire).unwrap(), req);
            prop_assert_eq!(wire[0] == SERVICE_LARGE_FORWARD_OPEN, req.is_large());
        }
    }
}
