//! The anchor and the load of benches/bench_cip_push.py, std only.
//!
//! `udp_count recv --port P --seconds S [--warmup W] [--rcvbuf BYTES]` binds 127.0.0.1:P
//! (0: any free port), asks SO_RCVBUF, prints `{"port": .., "rcvbuf": ..}`, then only counts
//! datagrams: the window opens W s after the first datagram and lasts S s (or ends when the
//! sender has been silent for 0.5 s). It prints the count, the rate, the socket's drop
//! counter from /proc/net/udp and its CPU time and run-queue wait over the window
//! (/proc/self/schedstat) as one JSON line.
//!
//! `udp_count send --to HOST:PORT --frames FILE --size N --seconds S [--rate R]` sends the
//! N-byte class-1 datagrams of FILE (concatenated) round and round from 127.0.0.1 for S s,
//! at full speed or R datagrams/s, rewriting each one's 32-bit sequence number (bytes 10..14)
//! and CIP sequence count (bytes 18..20) so both increase as a real producer's do. It
//! prints what it sent and its CPU time and run-queue wait as one JSON line.

use std::collections::HashMap;
use std::fs;
use std::io::{self, ErrorKind, Write};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::raw::{c_int, c_void};
use std::process::ExitCode;
use std::time::{Duration, Instant};

const SOL_SOCKET: c_int = 1;
const SO_RCVBUF: c_int = 8;
/// Datagrams per sendmmsg call.
const BATCH: usize = 32;
/// The sender's pause between batches when paced (it sends what is due, then sleeps).
const PACE_SLEEP: Duration = Duration::from_micros(100);
/// The receiver's window ends this long after the last datagram.
const IDLE_END: Duration = Duration::from_millis(500);

/// One datagram of a sendmmsg batch (x86_64/aarch64 Linux layouts).
#[repr(C)]
struct IoVec {
    base: *mut c_void,
    len: usize,
}

#[repr(C)]
struct MsgHdr {
    name: *mut c_void,
    namelen: u32,
    iov: *mut IoVec,
    iovlen: usize,
    control: *mut c_void,
    controllen: usize,
    flags: c_int,
}

#[repr(C)]
struct MMsgHdr {
    hdr: MsgHdr,
    len: u32,
}

extern "C" {
    fn sendmmsg(fd: c_int, msgs: *mut MMsgHdr, count: u32, flags: c_int) -> c_int;
    fn setsockopt(fd: c_int, level: c_int, name: c_int, value: *const c_void, len: u32) -> c_int;
    fn getsockopt(fd: c_int, level: c_int, name: c_int, value: *mut c_void, len: *mut u32)
        -> c_int;
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("recv") => options(&args[1..]).and_then(|o| recv(&o)),
        Some("send") => options(&args[1..]).and_then(|o| send(&o)),
        _ => Err("usage: udp_count recv|send --option value ...".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("udp_count: {message}");
            ExitCode::FAILURE
        }
    }
}

struct Options(HashMap<String, String>);

impl Options {
    fn get<T: std::str::FromStr>(&self, name: &str, default: Option<T>) -> Result<T, String> {
        match self.0.get(name) {
            Some(text) => text
                .parse()
                .map_err(|_| format!("--{name}: cannot read {text:?}")),
            None => default.ok_or_else(|| format!("--{name} is required")),
        }
    }
}

fn options(args: &[String]) -> Result<Options, String> {
    let mut map = HashMap::new();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let name = flag
            .strip_prefix("--")
            .ok_or_else(|| format!("expected --option, got {flag:?}"))?;
        let value = it.next().ok_or_else(|| format!("--{name} needs a value"))?;
        map.insert(name.to_string(), value.clone());
    }
    Ok(Options(map))
}

fn emit(line: &str) -> Result<(), String> {
    let mut out = io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| format!("stdout: {e}"))
}

/// SO_RCVBUF as the kernel reports it (twice what it granted, for its bookkeeping).
fn recv_buffer(socket: &UdpSocket, asked: usize) -> Result<usize, String> {
    let fd = socket.as_raw_fd();
    let want = c_int::try_from(asked).map_err(|_| "--rcvbuf is too large".to_string())?;
    let size = std::mem::size_of::<c_int>() as u32;
    // SAFETY: a valid descriptor and a c_int the call only reads.
    let rc = unsafe {
        setsockopt(
            fd,
            SOL_SOCKET,
            SO_RCVBUF,
            (&want as *const c_int).cast(),
            size,
        )
    };
    if rc != 0 {
        return Err(format!("SO_RCVBUF: {}", io::Error::last_os_error()));
    }
    let mut got: c_int = 0;
    let mut len = size;
    // SAFETY: a valid descriptor and a c_int with its length, both owned here.
    let rc = unsafe {
        getsockopt(
            fd,
            SOL_SOCKET,
            SO_RCVBUF,
            (&mut got as *mut c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(format!("SO_RCVBUF: {}", io::Error::last_os_error()));
    }
    Ok(usize::try_from(got).unwrap_or(0))
}

/// The receive-queue drop counter (last column of /proc/net/udp) of the socket on `port`.
fn socket_drops(port: u16) -> Option<u64> {
    let table = fs::read_to_string("/proc/net/udp").ok()?;
    let suffix = format!(":{port:04X}");
    table.lines().skip(1).find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.get(1)?.ends_with(&suffix) {
            cols.last()?.parse().ok()
        } else {
            None
        }
    })
}

/// (ns on a CPU, ns runnable but waiting for one) of this process's main thread.
fn schedstat() -> (u64, u64) {
    let text = fs::read_to_string("/proc/self/schedstat").unwrap_or_default();
    let mut cols = text.split_whitespace().map(|c| c.parse().unwrap_or(0));
    (cols.next().unwrap_or(0), cols.next().unwrap_or(0))
}

fn recv(o: &Options) -> Result<(), String> {
    let port: u16 = o.get("port", Some(0))?;
    let seconds: f64 = o.get("seconds", None)?;
    let warmup: f64 = o.get("warmup", Some(0.0))?;
    let asked: usize = o.get("rcvbuf", Some(4 << 20))?;
    let socket = UdpSocket::bind(("127.0.0.1", port)).map_err(|e| format!("bind: {e}"))?;
    let rcvbuf = recv_buffer(&socket, asked)?;
    let port = socket.local_addr().map_err(|e| e.to_string())?.port();
    emit(&format!("{{\"port\": {port}, \"rcvbuf\": {rcvbuf}}}"))?;

    let mut buf = [0u8; 2048];
    // Blocks until the sender starts, then the window opens `warmup` s later.
    socket.recv(&mut buf).map_err(|e| format!("recv: {e}"))?;
    socket
        .set_read_timeout(Some(IDLE_END))
        .map_err(|e| e.to_string())?;
    let opens = Instant::now() + Duration::from_secs_f64(warmup);
    let closes = opens + Duration::from_secs_f64(seconds);
    let mut before = 1u64;
    let mut total = 1u64;
    let mut opened = false;
    let mut last = Instant::now();
    let (mut cpu0, mut wait0) = (0, 0);
    loop {
        match socket.recv(&mut buf) {
            Ok(_) => total += 1,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("recv: {e}")),
        }
        // The clock is read every 64 datagrams: the loop stays a bare receive loop.
        if total.is_multiple_of(64) {
            last = Instant::now();
            if !opened && last >= opens {
                opened = true;
                before = total;
                (cpu0, wait0) = schedstat();
            } else if last >= closes {
                break;
            }
        }
    }
    let (cpu1, wait1) = schedstat();
    let (count, window) = if opened {
        (total - before, last.duration_since(opens).as_secs_f64())
    } else {
        (0, 0.0)
    };
    let rate = if window > 0.0 {
        count as f64 / window
    } else {
        0.0
    };
    let drops = socket_drops(port).map_or("null".into(), |d| d.to_string());
    emit(&format!(
        "{{\"count\": {count}, \"seconds\": {window:.6}, \"rate\": {rate:.1}, \
         \"total\": {total}, \"drops\": {drops}, \"rcvbuf\": {rcvbuf}, \
         \"cpu_ns\": {}, \"wait_ns\": {}}}",
        cpu1.saturating_sub(cpu0),
        wait1.saturating_sub(wait0)
    ))
}

fn send(o: &Options) -> Result<(), String> {
    let to: SocketAddr = o.get("to", None)?;
    let path: String = o.get("frames", None)?;
    let size: usize = o.get("size", None)?;
    let seconds: f64 = o.get("seconds", None)?;
    let rate: f64 = o.get("rate", Some(0.0))?;
    let frames = fs::read(&path).map_err(|e| format!("{path}: {e}"))?;
    if size < 20 || frames.is_empty() || frames.len() % size != 0 {
        return Err(format!(
            "{path}: {} bytes is not a whole number of {size}-byte datagrams (>= 20 bytes)",
            frames.len()
        ));
    }
    let socket = UdpSocket::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    socket
        .connect(to)
        .map_err(|e| format!("connect {to}: {e}"))?;
    let n = frames.len() / size;
    let mut batch = vec![0u8; BATCH * size];
    let mut iovecs: Vec<IoVec> = (0..BATCH)
        .map(|_| IoVec {
            base: std::ptr::null_mut(),
            len: size,
        })
        .collect();
    let mut headers: Vec<MMsgHdr> = (0..BATCH)
        .map(|_| MMsgHdr {
            hdr: MsgHdr {
                name: std::ptr::null_mut(),
                namelen: 0,
                iov: std::ptr::null_mut(),
                iovlen: 1,
                control: std::ptr::null_mut(),
                controllen: 0,
                flags: 0,
            },
            len: 0,
        })
        .collect();
    let start = Instant::now();
    let (cpu0, wait0) = schedstat();
    let end = start + Duration::from_secs_f64(seconds);
    let mut sent = 0u64;
    let mut errors = 0u64;
    let mut first_error = String::new();
    let mut sequence = 0u32;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        let due = if rate > 0.0 {
            (now.duration_since(start).as_secs_f64() * rate) as u64
        } else {
            sent + BATCH as u64
        };
        while sent < due {
            let count = (due - sent).min(BATCH as u64) as usize;
            for (i, out) in batch.chunks_exact_mut(size).take(count).enumerate() {
                let seq = sequence.wrapping_add(1 + i as u32);
                let at = (seq as usize % n) * size;
                out.copy_from_slice(&frames[at..at + size]);
                out[10..14].copy_from_slice(&seq.to_le_bytes());
                out[18..20].copy_from_slice(&(seq as u16).to_le_bytes());
            }
            // The pointers are taken afresh after the writes, so no reference outlives them.
            for ((header, iov), chunk) in headers
                .iter_mut()
                .zip(iovecs.iter_mut())
                .zip(batch.chunks_exact_mut(size))
            {
                iov.base = chunk.as_mut_ptr().cast();
                header.hdr.iov = iov;
            }
            // SAFETY: `count` <= BATCH headers, each with one iovec into `batch`, all alive
            // and unaliased until the call returns.
            let rc = unsafe { sendmmsg(socket.as_raw_fd(), headers.as_mut_ptr(), count as u32, 0) };
            if rc < 0 {
                // A receiver gone (ECONNREFUSED) or a full queue: counted, not fatal.
                if errors == 0 {
                    first_error = io::Error::last_os_error().to_string();
                }
                errors += 1;
                sequence = sequence.wrapping_add(count as u32);
                break;
            }
            sequence = sequence.wrapping_add(rc as u32);
            sent += rc as u64;
        }
        if rate > 0.0 {
            std::thread::sleep(PACE_SLEEP);
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let (cpu1, wait1) = schedstat();
    emit(&format!(
        "{{\"sent\": {sent}, \"seconds\": {elapsed:.6}, \"rate\": {:.1}, \"errors\": {errors}, \
         \"first_error\": {first_error:?}, \"cpu_ns\": {}, \"wait_ns\": {}}}",
        sent as f64 / elapsed,
        cpu1 - cpu0,
        wait1 - wait0
    ))
}
