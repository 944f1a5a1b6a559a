//! The class-1 I/O engine over real loopback UDP sockets: a std socket plays the target.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use unskit_core::cip::frame::{self, RealTimeFormat};
use unskit_core::cip::io::{ConnectionSetup, EngineOptions, IoEngine, Sample};
use unskit_core::cip::plan::{FieldSpec, InputPlan, Scalar, Value};
use unskit_core::cip::types::CipType;
use unskit_core::signal::Deadband;

const T2O: u32 = 0x0A0B_0C0D;
const O2T: u32 = 0x0102_0304;

fn plan() -> InputPlan {
    let spec = FieldSpec {
        name: "count".into(),
        offset: 0,
        ty: CipType::Udint,
        bit: None,
        array_count: None,
        scale: None,
        value_offset: None,
        deadband: Deadband::None,
        always: true,
    };
    InputPlan::new(101, 4, RealTimeFormat::Modeless, 0, &[spec]).unwrap()
}

fn target() -> UdpSocket {
    let s = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s
}

fn open(engine: &IoEngine, target: &UdpSocket, multiplier: u32) {
    engine
        .open(
            9,
            ConnectionSetup {
                t2o_connection_id: T2O,
                o2t_connection_id: O2T,
                target: target.local_addr().unwrap(),
                source: Ipv4Addr::LOCALHOST.into(),
                t2o_api_us: 5_000,
                o2t_api_us: 2_000,
                timeout_multiplier: multiplier,
                input: plan(),
                output_format: RealTimeFormat::Header32,
                output_image: vec![0xAA; 3],
                run: true,
                multicast_group: None,
            },
        )
        .unwrap();
}

fn samples_until(engine: &IoEngine, n: usize) -> Vec<Sample> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut out = Vec::new();
    while out.len() < n {
        assert!(Instant::now() < deadline, "only {} samples", out.len());
        out.extend(engine.poll(Duration::from_millis(100), 1000).0);
    }
    out
}

#[test]
fn values_in_datagrams_out_and_the_watchdog_on_real_sockets() {
    let engine = IoEngine::bind(
        SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        EngineOptions::default(),
    )
    .unwrap();
    let port = engine.local_port();
    let target = target();
    open(&engine, &target, 20);
    // O-to-T: consecutive sequence numbers from 1, the image and the run bit.
    let mut buf = [0u8; 256];
    for expected in 1..=5u32 {
        let n = target.recv(&mut buf).unwrap();
        let d = frame::parse_datagram(&buf[..n], RealTimeFormat::Header32, 3).unwrap();
        assert_eq!(
            (
                d.connection_id,
                d.sequence_number,
                d.cip_sequence,
                d.run(),
                d.data
            ),
            (O2T, expected, 1, true, &[0xAA; 3][..])
        );
    }
    // T-to-O: three datagrams, one a duplicate.
    for seq in [1u32, 2, 2, 3] {
        let mut wire = Vec::new();
        frame::build(
            &mut wire,
            T2O,
            seq,
            0,
            RealTimeFormat::Modeless,
            true,
            &(seq * 1000).to_le_bytes(),
        )
        .unwrap();
        target.send_to(&wire, (Ipv4Addr::LOCALHOST, port)).unwrap();
    }
    let got = samples_until(&engine, 3);
    let values: Vec<_> = got
        .iter()
        .map(|s| (s.key, &*s.signal, s.value.clone(), s.run))
        .collect();
    let v = |i| Value::Scalar(Scalar::Int(i));
    assert_eq!(
        values,
        [
            (9, "a101/0/UDINT", v(1000), None),
            (9, "a101/0/UDINT", v(2000), None),
            (9, "a101/0/UDINT", v(3000), None)
        ]
    );
    let stats = engine.stats(9).unwrap();
    assert_eq!(stats.drops[8], ("duplicate", 1));
    // No more T-to-O: the watchdog (20 x 5 ms) fires once.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut timed_out = Vec::new();
    while timed_out.is_empty() {
        assert!(Instant::now() < deadline, "no watchdog");
        timed_out = engine.poll(Duration::from_millis(100), 10).1;
    }
    assert_eq!(timed_out, [9]);
    engine.shutdown();
    engine.shutdown();
    assert!(engine.open(10, setup_copy(&target)).is_err());
}

fn setup_copy(target: &UdpSocket) -> ConnectionSetup {
    ConnectionSetup {
        t2o_connection_id: 1,
        o2t_connection_id: 2,
        target: target.local_addr().unwrap(),
        source: Ipv4Addr::LOCALHOST.into(),
        t2o_api_us: 1000,
        o2t_api_us: 1000,
        timeout_multiplier: 4,
        input: plan(),
        output_format: RealTimeFormat::Modeless,
        output_image: vec![],
        run: true,
        multicast_group: None,
    }
}
