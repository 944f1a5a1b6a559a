//! An independent decoder reads our Connection Manager requests and replies: Wireshark's
//! ENIP/CIP dissector (tshark) on a pcap of SendRRData encapsulations, TCP port 44818.
//! Skips only outside CI when tshark or text2pcap is missing; in CI a missing tool fails.

use std::path::PathBuf;
use std::process::Command;

use unskit_core::cip::connection::{
    status_name, ConnectionFailure, ConnectionPath, ConnectionType, ElectronicKey,
    ForwardCloseRequest, ForwardOpenRequest, ForwardOpenSuccess, NetworkParameters, Priority,
    TransportTrigger,
};

/// EtherNet/IP SendRRData (command 0x6F): the 24-byte encapsulation header, then the
/// interface handle, timeout and a CPF with a null address item and an unconnected data
/// item (0x00B2) carrying the CIP message.
fn send_rr_data(context: u8, cip: &[u8]) -> Vec<u8> {
    let mut cpf = Vec::new();
    cpf.extend_from_slice(&0u32.to_le_bytes()); // interface handle: CIP
    cpf.extend_from_slice(&0u16.to_le_bytes()); // timeout
    cpf.extend_from_slice(&2u16.to_le_bytes()); // item count
    cpf.extend_from_slice(&[0x00, 0x00, 0x00, 0x00]); // null address item, length 0
    cpf.extend_from_slice(&0x00B2u16.to_le_bytes());
    cpf.extend_from_slice(&u16::try_from(cip.len()).unwrap().to_le_bytes());
    cpf.extend_from_slice(cip);
    let mut out = Vec::new();
    out.extend_from_slice(&0x006Fu16.to_le_bytes());
    out.extend_from_slice(&u16::try_from(cpf.len()).unwrap().to_le_bytes());
    out.extend_from_slice(&0x0000_0001u32.to_le_bytes()); // session handle
    out.extend_from_slice(&[0; 4]); // status
    out.extend_from_slice(&[context, 0, 0, 0, 0, 0, 0, 0]); // sender context: pairs a reply
    out.extend_from_slice(&[0; 4]); // options
    out.extend_from_slice(&cpf);
    out
}

/// text2pcap's input (`-D`): a direction line, then offset-prefixed hex lines. With
/// `-T 50000,44818`, `I` runs 50000 -> 44818 (a request) and `O` the other way (a reply,
/// service bit 7), so the dissector pairs each reply with its request.
fn hexdump(packets: &[Vec<u8>]) -> String {
    let mut text = String::new();
    for packet in packets {
        let reply = packet.get(40).is_some_and(|service| service & 0x80 != 0);
        text.push_str(if reply { "O\n" } else { "I\n" });
        for (i, chunk) in packet.chunks(16).enumerate() {
            text.push_str(&format!("{:06x}", i * 16));
            for b in chunk {
                text.push_str(&format!(" {b:02x}"));
            }
            text.push('\n');
        }
        text.push('\n');
    }
    text
}

fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() && std::env::var_os("CI").is_some() {
        panic!("{name} is required in CI (Debian package tshark)");
    }
    found
}

fn params(connection_type: ConnectionType, size: u16) -> NetworkParameters {
    NetworkParameters {
        redundant_owner: false,
        connection_type,
        priority: Priority::Scheduled,
        variable_size: false,
        size,
    }
}

fn open(large: bool) -> ForwardOpenRequest {
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
        o2t: params(ConnectionType::PointToPoint, if large { 600 } else { 38 }),
        t2o_rpi_us: 20_000,
        t2o: params(ConnectionType::Multicast, if large { 1000 } else { 70 }),
        transport: TransportTrigger::CLASS1_CYCLIC,
        path: ConnectionPath {
            key: large.then_some(ElectronicKey {
                vendor_id: 1,
                device_type: 12,
                product_code: 42,
                compatibility: true,
                major_revision: 3,
                minor_revision: 5,
            }),
            config: 151,
            output: if large { 0x0300 } else { 150 },
            input: 100,
        },
    }
}

/// Runs tshark over the packets; answers (`-V` text, one `;`-separated row per packet).
fn dissect(name: &str, packets: &[Vec<u8>], fields: &[&str]) -> Option<(String, Vec<String>)> {
    let text2pcap = tool("text2pcap")?;
    let tshark = tool("tshark")?;
    let dir = std::env::temp_dir().join(format!("unskit-cip-tshark-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hex = dir.join("packets.txt");
    let pcap = dir.join("packets.pcap");
    std::fs::write(&hex, hexdump(packets)).unwrap();
    let status = Command::new(text2pcap)
        .args(["-q", "-D", "-T", "50000,44818"])
        .arg(&hex)
        .arg(&pcap)
        .status()
        .unwrap();
    assert!(status.success(), "text2pcap failed");
    let verbose = Command::new(&tshark)
        .arg("-r")
        .arg(&pcap)
        .arg("-V")
        .output()
        .unwrap();
    assert!(verbose.status.success(), "tshark -V failed");
    let mut args = vec!["-T", "fields", "-E", "separator=;"];
    for f in fields {
        args.extend_from_slice(&["-e", f]);
    }
    let rows = Command::new(&tshark)
        .arg("-r")
        .arg(&pcap)
        .args(&args)
        .output()
        .unwrap();
    assert!(rows.status.success(), "tshark -T fields failed");
    std::fs::remove_dir_all(&dir).unwrap();
    let rows = String::from_utf8(rows.stdout).unwrap();
    Some((
        String::from_utf8(verbose.stdout).unwrap(),
        rows.lines().map(str::to_owned).collect(),
    ))
}

#[test]
fn tshark_reads_forward_open_requests_small_and_large() {
    let mut packets = Vec::new();
    for large in [false, true] {
        let mut cip = Vec::new();
        open(large).encode(&mut cip).unwrap();
        packets.push(send_rr_data(1 + u8::from(large), &cip));
    }
    let fields = [
        "cip.cm.ot_connid",
        "cip.cm.to_connid",
        "cip.cm.conn_serial_num",
        "cip.cm.timeout_multiplier",
        "cip.cm.otrpi",
        "cip.cm.torpi",
        "cip.cm.fwo.consize",
        "cip.cm.fwo.type",
        "cip.cm.fwo.transport",
        "cip.cm.connpath_size",
    ];
    let Some((verbose, rows)) = dissect("open", &packets, &fields) else {
        eprintln!("tshark or text2pcap not installed; skipped outside CI");
        return;
    };
    assert!(!verbose.contains("Malformed"), "{verbose}");
    for line in [
        "Service: Forward Open (Request)",
        "Service: Large Forward Open (Request)",
        "Connection Path: Assembly, Instance: 0x97, Connection Point: 0x96, Connection Point: 0x64",
        "Connection Path: [Key], Assembly, Instance: 0x97, Connection Point: 0x0300, Connection Point: 0x64",
        "Connection Timeout Multiplier: *16 (2)",
    ] {
        assert!(verbose.contains(line), "{line:?} not in {verbose}");
    }
    // O->T id, T->O id, serial, multiplier, RPIs (us), sizes, types (p2p 2, multicast 1),
    // class, path words: as the dissector reads them.
    assert_eq!(
        rows,
        [
            "0x11223344;0x55667788;0x1234;2;10000;20000;38,70;2,1;1;4",
            "0x11223344;0x55667788;0x1234;2;10000;20000;600,1000;2,1;1;10",
        ]
    );
}

#[test]
fn tshark_reads_forward_open_replies_and_forward_close() {
    let mut request = Vec::new();
    open(false).encode(&mut request).unwrap();
    let success = ForwardOpenSuccess {
        large: false,
        o2t_connection_id: 0x7FFE_0001,
        t2o_connection_id: 0x5566_7788,
        connection_serial: 0x1234,
        originator_vendor_id: 1,
        originator_serial: 0xDEAD_BEEF,
        o2t_api_us: 10_000,
        t2o_api_us: 40_000,
        application_reply: vec![],
    };
    let mut opened = Vec::new();
    success.encode(&mut opened).unwrap();
    let mut large_request = Vec::new();
    let mut large = open(true);
    large.connection_serial = 0x4321;
    large.encode(&mut large_request).unwrap();
    let mut large_opened = Vec::new();
    ForwardOpenSuccess {
        large: true,
        connection_serial: 0x4321,
        o2t_connection_id: 0x7FFE_0002,
        t2o_api_us: 20_000,
        application_reply: vec![0xAA, 0xBB],
        ..success
    }
    .encode(&mut large_opened)
    .unwrap();
    let mut refused = Vec::new();
    ConnectionFailure {
        service: 0xD4,
        general: 0x01,
        additional: vec![0x0100],
        triad: Some((0x1234, 1, 0xDEAD_BEEF)),
        remaining_path_size: Some(0),
    }
    .encode(&mut refused)
    .unwrap();
    let mut close = Vec::new();
    let o = open(false);
    ForwardCloseRequest {
        priority_time_tick: o.priority_time_tick,
        timeout_ticks: o.timeout_ticks,
        connection_serial: o.connection_serial,
        originator_vendor_id: o.originator_vendor_id,
        originator_serial: o.originator_serial,
        path: o.path,
    }
    .encode(&mut close)
    .unwrap();
    let packets = [
        send_rr_data(1, &request),
        send_rr_data(1, &opened),
        send_rr_data(2, &request),
        send_rr_data(2, &refused),
        send_rr_data(3, &close),
        send_rr_data(4, &large_request),
        send_rr_data(4, &large_opened),
    ];
    let fields = [
        "cip.cm.ot_connid",
        "cip.cm.to_connid",
        "cip.cm.otapi",
        "cip.cm.toapi",
        "cip.cm.genstat",
        "cip.cm.ext_status",
        "cip.cm.conn_serial_num",
        "cip.cm.orig_serial_num",
    ];
    let Some((verbose, rows)) = dissect("replies", &packets, &fields) else {
        eprintln!("tshark or text2pcap not installed; skipped outside CI");
        return;
    };
    assert!(!verbose.contains("Malformed"), "{verbose}");
    for line in [
        "Service: Forward Open (Response)",
        "Service: Large Forward Open (Response)",
        "Service: Forward Close (Request)",
        "Application Reply: aabb",
    ] {
        assert!(verbose.contains(line), "{line:?} not in {verbose}");
    }
    // Our status name is Wireshark's, letter case aside.
    let theirs = "Extended Status: Connection in use or duplicate Forward Open (0x0100)";
    assert!(verbose.contains(theirs), "{verbose}");
    assert_eq!(
        status_name(0x01, Some(0x0100)),
        "connection in use or duplicate forward open"
    );
    // Ids, APIs (us), general and extended status, serial, originator serial. The
    // Forward Close row shows the APIs the dissector remembers for the connection it closes.
    assert_eq!(
        rows,
        [
            "0x11223344;0x55667788;;;;;0x1234;0xdeadbeef",
            "0x7ffe0001;0x55667788;10000;40000;;;0x1234;0xdeadbeef",
            "0x11223344;0x55667788;;;;;0x1234;0xdeadbeef",
            ";;;;0x01;0x0100;0x1234;0xdeadbeef",
            ";;10000;40000;;;0x1234;0xdeadbeef",
            "0x11223344;0x55667788;;;;;0x4321;0xdeadbeef",
            "0x7ffe0002;0x55667788;10000;20000;;;0x4321;0xdeadbeef",
        ]
    );
}
