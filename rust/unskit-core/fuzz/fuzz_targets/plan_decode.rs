//! A fixed plan over every field type decodes any bytes (as a datagram, and as assembly
//! data framed correctly) without a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use unskit_core::cip::frame::{build, RealTimeFormat};
use unskit_core::cip::plan::{FieldSpec, InputPlan, Sink};
use unskit_core::cip::types::CipType;
use unskit_core::signal::Deadband;

struct Count(usize);

impl Sink for Count {
    fn publish(&mut self, _field: usize, values: &[f64]) -> bool {
        self.0 += values.len();
        true
    }
}

const SIZE: usize = 64;

fn plan() -> InputPlan {
    let mut specs = Vec::new();
    let mut offset = 0;
    for (i, ty) in CipType::ALL.into_iter().enumerate() {
        specs.push(FieldSpec {
            name: format!("f{i}"),
            offset,
            ty,
            bit: None,
            array_count: (i % 3 == 0 && ty != CipType::Bool).then_some(2),
            scale: (ty != CipType::Bool && i % 2 == 0).then_some(0.5),
            value_offset: None,
            deadband: if ty == CipType::Bool {
                Deadband::None
            } else {
                Deadband::Percent(1.0)
            },
            always: false,
        });
        offset += ty.size()
            * if i % 3 == 0 && ty != CipType::Bool {
                2
            } else {
                1
            };
    }
    assert!(offset <= SIZE, "{offset}");
    InputPlan::new(1, SIZE, RealTimeFormat::Header32, 0, &specs).unwrap()
}

fuzz_target!(|data: &[u8]| {
    let mut p = plan();
    let mut sink = Count(0);
    let _ = p.decode(data, 0, &mut sink);
    let mut assembly = data.to_vec();
    assembly.resize(SIZE, 0);
    let mut wire = Vec::new();
    build(
        &mut wire,
        1,
        2,
        3,
        RealTimeFormat::Header32,
        true,
        &assembly,
    )
    .unwrap();
    assert!(p.decode(&wire, 1, &mut sink).is_ok());
});
