//! Assembly plans: compiled once from an assembly's fields, then used per datagram.
//!
//! An [`InputPlan`] decodes the T-to-O assembly of each datagram and returns only the
//! fields due for publication: a field is eligible `sample_ms` after its last publication,
//! then `always` publishes it and `onChange` asks the deadband (an array publishes when any
//! element passes, and then all its elements become the last published ones). An
//! [`OutputPlan`] writes engineering values into an O-to-T assembly with range checks.

use crate::cip::frame::{parse_datagram, Datagram, RealTimeFormat, Reason};
use crate::cip::types::CipType;
use crate::error::CoreError;
use crate::signal::{Deadband, Scaling};

/// One assembly field as the configuration states it.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldSpec {
    pub name: String,
    pub offset: usize,
    pub ty: CipType,
    pub bit: Option<u8>,
    pub array_count: Option<usize>,
    pub scale: Option<f64>,
    pub value_offset: Option<f64>,
    pub deadband: Deadband,
    /// publishMode `always`.
    pub always: bool,
}

/// A compiled field: where it sits, how to read it and its stable signal id.
#[derive(Debug, Clone)]
pub struct Field {
    pub id: String,
    pub name: String,
    pub offset: usize,
    pub ty: CipType,
    pub bit: Option<u8>,
    /// Elements: 1 for a scalar.
    pub count: usize,
    pub is_array: bool,
    pub scaling: Scaling,
    pub scaled: bool,
    deadband: Deadband,
    always: bool,
    /// Where this field's elements start in the plan's last-published values.
    first: usize,
}

impl Field {
    /// Bytes from `offset` the field covers.
    fn extent(&self) -> usize {
        let array_count = self.is_array.then_some(self.count);
        self.ty.field_bytes(self.bit.is_some(), array_count)
    }

    /// Element `k` as a raw integer (BOOL is 0 or 1); floats are not integers.
    #[inline]
    pub fn read_int(&self, data: &[u8], k: usize) -> i128 {
        let at = self.offset + k * self.ty.size();
        match self.ty {
            CipType::Bool => i128::from(self.read_bool(data, k)),
            CipType::Sint => i128::from(data[at] as i8),
            CipType::Usint => i128::from(data[at]),
            CipType::Int => i128::from(i16::from_le_bytes(bytes(data, at))),
            CipType::Uint => i128::from(u16::from_le_bytes(bytes(data, at))),
            CipType::Dint => i128::from(i32::from_le_bytes(bytes(data, at))),
            CipType::Udint => i128::from(u32::from_le_bytes(bytes(data, at))),
            CipType::Lint => i128::from(i64::from_le_bytes(bytes(data, at))),
            CipType::Ulint => i128::from(u64::from_le_bytes(bytes(data, at))),
            CipType::Real => f32::from_le_bytes(bytes(data, at)) as i128,
            CipType::Lreal => f64::from_le_bytes(bytes(data, at)) as i128,
        }
    }

    #[inline]
    pub fn read_bool(&self, data: &[u8], k: usize) -> bool {
        match self.bit {
            Some(bit) => data[self.offset] >> bit & 1 == 1,
            None if self.is_array => data[self.offset + k / 8] >> (k % 8) & 1 == 1,
            None => data[self.offset] != 0,
        }
    }

    /// Element `k` as an unscaled f64 (integers above 2**53 round).
    #[inline]
    pub fn read_raw(&self, data: &[u8], k: usize) -> f64 {
        let at = self.offset + k * self.ty.size();
        match self.ty {
            CipType::Bool => f64::from(u8::from(self.read_bool(data, k))),
            CipType::Sint => f64::from(data[at] as i8),
            CipType::Usint => f64::from(data[at]),
            CipType::Int => f64::from(i16::from_le_bytes(bytes(data, at))),
            CipType::Uint => f64::from(u16::from_le_bytes(bytes(data, at))),
            CipType::Dint => f64::from(i32::from_le_bytes(bytes(data, at))),
            CipType::Udint => f64::from(u32::from_le_bytes(bytes(data, at))),
            CipType::Lint => i64::from_le_bytes(bytes(data, at)) as f64,
            CipType::Ulint => u64::from_le_bytes(bytes(data, at)) as f64,
            CipType::Real => f64::from(f32::from_le_bytes(bytes(data, at))),
            CipType::Lreal => f64::from_le_bytes(bytes(data, at)),
        }
    }
}

/// One element of a decoded field as its consumer sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    Bool(bool),
    /// An unscaled integer field, exact (ULINT and LINT beyond 2**53 included).
    Int(i128),
    /// REAL, LREAL and every scaled field.
    Float(f64),
}

/// A decoded field: one element, or a list for an array (even of one element).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Scalar(Scalar),
    Array(Vec<Scalar>),
}

impl Field {
    /// The typed value of this field's published `values` (scaled, one per element) read
    /// from `data`: bool for BOOL, the exact integer when unscaled, a float otherwise.
    pub fn value(&self, data: &[u8], values: &[f64]) -> Value {
        let element = |k: usize| match self.ty {
            CipType::Bool => Scalar::Bool(values[k] != 0.0),
            CipType::Real | CipType::Lreal => Scalar::Float(values[k]),
            _ if self.scaled => Scalar::Float(values[k]),
            _ => Scalar::Int(self.read_int(data, k)),
        };
        if self.is_array {
            Value::Array((0..values.len()).map(element).collect())
        } else {
            Value::Scalar(element(0))
        }
    }

    /// Every element scaled, ungated.
    pub fn read_value(&self, data: &[u8]) -> Value {
        let values: Vec<f64> = (0..self.count)
            .map(|k| self.scaling.apply(self.read_raw(data, k)))
            .collect();
        self.value(data, &values)
    }
}

#[inline(always)]
fn bytes<const N: usize>(data: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&data[at..at + N]);
    out
}

fn compile(
    instance: u16,
    size: usize,
    specs: &[FieldSpec],
    input: bool,
) -> Result<Vec<Field>, CoreError> {
    let mut fields: Vec<Field> = Vec::with_capacity(specs.len());
    let mut first = 0;
    for spec in specs {
        let bad = |rule: String| CoreError::InvalidCip(format!("field {:?}: {rule}", spec.name));
        if spec.name.is_empty() {
            return Err(CoreError::InvalidCip("a field needs a name".into()));
        }
        if let Some(bit) = spec.bit {
            if spec.ty != CipType::Bool {
                return Err(bad(format!(
                    "bit is for BOOL fields only, not {}",
                    spec.ty.name()
                )));
            }
            if bit > 7 {
                return Err(bad(format!("bit must be 0 to 7, got {bit}")));
            }
            if spec.array_count.is_some() {
                return Err(bad("a bit field is a single element: no arrayCount".into()));
            }
        }
        if let Some(n) = spec.array_count {
            if !(1..=65535).contains(&n) {
                return Err(bad(format!("arrayCount must be 1 to 65535, got {n}")));
            }
        }
        let numeric = spec.ty != CipType::Bool;
        if !numeric && (spec.scale.is_some() || spec.value_offset.is_some()) {
            return Err(bad(
                "scale and valueOffset apply to numeric types only".into()
            ));
        }
        if !numeric && spec.deadband != Deadband::None {
            return Err(bad("a deadband applies to numeric types only".into()));
        }
        if !input && spec.deadband != Deadband::None {
            return Err(bad("output fields take no deadband".into()));
        }
        if numeric {
            if let Some(0.0) = spec.scale {
                if !input {
                    return Err(bad("an output field's scale cannot be 0".into()));
                }
            }
        }
        let scaling =
            Scaling::new(spec.scale, spec.value_offset).map_err(|e| bad(e.to_string()))?;
        let count = spec.array_count.unwrap_or(1);
        let id = match spec.bit {
            Some(bit) => format!("a{instance}/{}/{}.{bit}", spec.offset, spec.ty.name()),
            None => format!("a{instance}/{}/{}", spec.offset, spec.ty.name()),
        };
        let field = Field {
            id,
            name: spec.name.clone(),
            offset: spec.offset,
            ty: spec.ty,
            bit: spec.bit,
            count,
            is_array: spec.array_count.is_some(),
            scaling,
            scaled: spec.scale.is_some() || spec.value_offset.is_some(),
            deadband: spec.deadband,
            always: spec.always,
            first,
        };
        let end = spec.offset.saturating_add(field.extent());
        if end > size {
            return Err(bad(format!(
                "bytes {}..{end} do not fit inside sizeBytes {size}",
                spec.offset
            )));
        }
        // Fields may overlap (the spec allows it: a DINT and its bits); the same id twice
        // could not be told apart, and the same name twice breaks "unique per device".
        if let Some(other) = fields
            .iter()
            .find(|f| f.id == field.id || f.name == field.name)
        {
            return Err(bad(format!(
                "same {} as field {:?}",
                if other.id == field.id {
                    format!("signal id {}", field.id)
                } else {
                    "name".into()
                },
                other.name
            )));
        }
        first += count;
        fields.push(field);
    }
    Ok(fields)
}

/// What [`InputPlan::decode`] hands out per field due for publication.
pub trait Sink {
    /// Field `field` of the current datagram publishes `values` (scaled, one per element).
    /// False when the sink could not take them: the plan then keeps the field's last
    /// publication as it was, so the next datagram offers the field again.
    fn publish(&mut self, field: usize, values: &[f64]) -> bool;
}

/// A T-to-O assembly's fields, their gates and last publication times.
#[derive(Debug, Clone)]
pub struct InputPlan {
    pub instance: u16,
    pub size: usize,
    pub format: RealTimeFormat,
    pub sample_ms: u64,
    fields: Vec<Field>,
    /// Last published scaled value of every element of every field.
    last: Vec<f64>,
    /// Last publication time per field; None before the first.
    published_ms: Vec<Option<u64>>,
    scratch: Vec<f64>,
}

impl InputPlan {
    pub fn new(
        instance: u16,
        size: usize,
        format: RealTimeFormat,
        sample_ms: u64,
        specs: &[FieldSpec],
    ) -> Result<Self, CoreError> {
        if size == 0 {
            return Err(CoreError::InvalidCip(
                "input sizeBytes must be at least 1".into(),
            ));
        }
        if format == RealTimeFormat::Heartbeat {
            return Err(CoreError::InvalidCip(
                "an input assembly is modeless or header32, not heartbeat".into(),
            ));
        }
        if specs.is_empty() {
            return Err(CoreError::InvalidCip(
                "an input assembly needs at least one field".into(),
            ));
        }
        let fields = compile(instance, size, specs, true)?;
        let elements = fields.iter().map(|f| f.count).sum();
        let widest = fields.iter().map(|f| f.count).max().unwrap_or(0);
        Ok(InputPlan {
            instance,
            size,
            format,
            sample_ms,
            published_ms: vec![None; fields.len()],
            fields,
            last: vec![0.0; elements],
            scratch: Vec::with_capacity(widest),
        })
    }

    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    /// Forgets every last publication (the next datagram publishes every field).
    pub fn reset(&mut self) {
        self.published_ms.iter_mut().for_each(|p| *p = None);
    }

    /// Parses one whole datagram and publishes the fields due; the datagram is returned
    /// for its sequence count and run/idle bit, or the reason it was dropped.
    pub fn decode<'a>(
        &mut self,
        datagram: &'a [u8],
        now_ms: u64,
        sink: &mut impl Sink,
    ) -> Result<Datagram<'a>, Reason> {
        let parsed = parse_datagram(datagram, self.format, self.size)?;
        self.decode_data(parsed.data, now_ms, sink);
        Ok(parsed)
    }

    /// The assembly data alone, parsed by the caller: publishes the fields due. Data of
    /// another length than `size` publishes nothing.
    pub fn decode_data(&mut self, data: &[u8], now_ms: u64, sink: &mut impl Sink) {
        if data.len() != self.size {
            return;
        }
        let sample_ms = self.sample_ms;
        for (index, field) in self.fields.iter().enumerate() {
            if let Some(at) = self.published_ms[index] {
                if now_ms.saturating_sub(at) < sample_ms {
                    continue;
                }
            }
            let first_time = self.published_ms[index].is_none();
            let last = &mut self.last[field.first..field.first + field.count];
            self.scratch.clear();
            self.scratch
                .extend((0..field.count).map(|k| field.scaling.apply(field.read_raw(data, k))));
            let due = first_time
                || field.always
                || last
                    .iter()
                    .zip(&self.scratch)
                    .any(|(&l, &v)| field.deadband.passes(l, v));
            if due && sink.publish(index, &self.scratch) {
                last.copy_from_slice(&self.scratch);
                self.published_ms[index] = Some(now_ms);
            }
        }
    }
}

/// A value to write into an output field, in engineering units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OutValue {
    Bool(bool),
    Int(i128),
    Float(f64),
}

/// An O-to-T assembly's fields, for writes.
#[derive(Debug, Clone)]
pub struct OutputPlan {
    pub instance: u16,
    pub size: usize,
    pub format: RealTimeFormat,
    fields: Vec<Field>,
}

impl OutputPlan {
    pub fn new(
        instance: u16,
        size: usize,
        format: RealTimeFormat,
        specs: &[FieldSpec],
    ) -> Result<Self, CoreError> {
        if size == 0 && !specs.is_empty() {
            return Err(CoreError::InvalidCip(
                "a heartbeat output (sizeBytes 0) has no signals".into(),
            ));
        }
        if format == RealTimeFormat::Heartbeat && size != 0 {
            return Err(CoreError::InvalidCip(
                "a heartbeat output carries no data: sizeBytes 0".into(),
            ));
        }
        // sizeBytes 0 means heartbeat whatever the (defaulted) realTimeFormat says.
        let format = if size == 0 {
            RealTimeFormat::Heartbeat
        } else {
            format
        };
        Ok(OutputPlan {
            instance,
            size,
            format,
            fields: compile(instance, size, specs, false)?,
        })
    }

    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    /// Writes `values` (one per element) of field `index` into `assembly` (`size` bytes).
    /// Engineering values are unscaled, `(v - valueOffset) / scale`, integers rounded half
    /// to even and range-checked; nothing is written unless every element fits.
    pub fn encode(
        &self,
        assembly: &mut [u8],
        index: usize,
        values: &[OutValue],
    ) -> Result<(), CoreError> {
        let field = self
            .fields
            .get(index)
            .ok_or_else(|| CoreError::InvalidCip(format!("no output field {index}")))?;
        if assembly.len() != self.size {
            return Err(CoreError::InvalidCip(format!(
                "an output assembly is {} bytes, got {}",
                self.size,
                assembly.len()
            )));
        }
        if values.len() != field.count {
            return Err(CoreError::InvalidCip(format!(
                "{} takes {} value(s), got {}",
                field.id,
                field.count,
                values.len()
            )));
        }
        let raws = values
            .iter()
            .map(|&v| raw_of(field, v))
            .collect::<Result<Vec<_>, _>>()?;
        for (k, raw) in raws.into_iter().enumerate() {
            write_raw(field, assembly, k, raw);
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Raw {
    Bool(bool),
    Int(i128),
    Float(f64),
}

fn raw_of(field: &Field, value: OutValue) -> Result<Raw, CoreError> {
    let ty = field.ty;
    let bad = |rule: String| CoreError::InvalidCip(format!("{}: {rule}", field.id));
    if ty == CipType::Bool {
        return match value {
            OutValue::Bool(b) => Ok(Raw::Bool(b)),
            _ => Err(bad("BOOL takes true or false".into())),
        };
    }
    let engineering = match value {
        OutValue::Bool(_) => return Err(bad(format!("{} takes a number", ty.name()))),
        // An integer for an unscaled integer field is written exactly, even above 2**53.
        OutValue::Int(i) if !field.scaled && !ty.is_float() => return int_in_range(field, i),
        OutValue::Int(i) => i as f64,
        OutValue::Float(f) => f,
    };
    if !engineering.is_finite() {
        return Err(bad(format!("{} takes a finite number", ty.name())));
    }
    let (scale, offset) = field.scaling.factors();
    let raw = (engineering - offset) / scale;
    match ty {
        CipType::Real => {
            let narrowed = raw as f32;
            if !narrowed.is_finite() {
                return Err(bad(format!("raw {raw} is outside REAL's range")));
            }
            Ok(Raw::Float(f64::from(narrowed)))
        }
        CipType::Lreal => Ok(Raw::Float(raw)),
        _ => {
            let rounded = raw.round_ties_even();
            // Every integer type fits far inside 2**100, where the cast is exact.
            if rounded.abs() > 2f64.powi(100) {
                return Err(bad(format!(
                    "raw {rounded} is outside {}'s range",
                    ty.name()
                )));
            }
            int_in_range(field, rounded as i128)
        }
    }
}

fn int_in_range(field: &Field, raw: i128) -> Result<Raw, CoreError> {
    let (low, high) = field.ty.range().unwrap_or((i128::MIN, i128::MAX));
    if raw < low || raw > high {
        return Err(CoreError::InvalidCip(format!(
            "{}: raw {raw} is outside {}'s {low}..{high}",
            field.id,
            field.ty.name()
        )));
    }
    Ok(Raw::Int(raw))
}

fn write_raw(field: &Field, assembly: &mut [u8], k: usize, raw: Raw) {
    let at = field.offset + k * field.ty.size();
    let mut put = |bytes: &[u8]| assembly[at..at + bytes.len()].copy_from_slice(bytes);
    match (field.ty, raw) {
        (CipType::Bool, Raw::Bool(b)) => {
            let (byte, bit) = match field.bit {
                Some(bit) => (field.offset, bit),
                None if field.is_array => (field.offset + k / 8, (k % 8) as u8),
                None => {
                    assembly[field.offset] = u8::from(b);
                    return;
                }
            };
            if b {
                assembly[byte] |= 1 << bit;
            } else {
                assembly[byte] &= !(1 << bit);
            }
        }
        (CipType::Real, Raw::Float(f)) => put(&(f as f32).to_le_bytes()),
        (CipType::Lreal, Raw::Float(f)) => put(&f.to_le_bytes()),
        // The range was checked: these casts keep every bit of the value.
        (CipType::Sint, Raw::Int(i)) => put(&(i as i8).to_le_bytes()),
        (CipType::Usint, Raw::Int(i)) => put(&(i as u8).to_le_bytes()),
        (CipType::Int, Raw::Int(i)) => put(&(i as i16).to_le_bytes()),
        (CipType::Uint, Raw::Int(i)) => put(&(i as u16).to_le_bytes()),
        (CipType::Dint, Raw::Int(i)) => put(&(i as i32).to_le_bytes()),
        (CipType::Udint, Raw::Int(i)) => put(&(i as u32).to_le_bytes()),
        (CipType::Lint, Raw::Int(i)) => put(&(i as i64).to_le_bytes()),
        (CipType::Ulint, Raw::Int(i)) => put(&(i as u64).to_le_bytes()),
        // raw_of gives each type its kind of raw value; nothing else reaches here.
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cip::frame::build;
    use proptest::prelude::*;

    fn spec(name: &str, offset: usize, ty: CipType) -> FieldSpec {
        FieldSpec {
            name: name.into(),
            offset,
            ty,
            bit: None,
            array_count: None,
            scale: None,
            value_offset: None,
            deadband: Deadband::None,
            always: false,
        }
    }

    #[derive(Default)]
    struct Collect(Vec<(usize, Vec<f64>)>);

    impl Sink for Collect {
        fn publish(&mut self, field: usize, values: &[f64]) -> bool {
            self.0.push((field, values.to_vec()));
            true
        }
    }

    fn frame(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        build(&mut out, 1, 2, 3, RealTimeFormat::Header32, true, data).unwrap();
        out
    }

    fn plan(sample_ms: u64, specs: &[FieldSpec]) -> InputPlan {
        InputPlan::new(100, 16, RealTimeFormat::Header32, sample_ms, specs).unwrap()
    }

    #[test]
    fn ids_types_bits_arrays_and_scaling() {
        let mut bit = spec("run", 0, CipType::Bool);
        bit.bit = Some(3);
        let mut arr = spec("temps", 2, CipType::Int);
        arr.array_count = Some(2);
        arr.scale = Some(0.5);
        arr.value_offset = Some(1.0);
        let mut bools = spec("flags", 10, CipType::Bool);
        bools.array_count = Some(10);
        let specs = [
            bit,
            arr,
            spec("big", 6, CipType::Real),
            bools,
            spec("s", 12, CipType::Sint),
        ];
        let mut p = plan(0, &specs);
        let ids: Vec<_> = p.fields().iter().map(|f| f.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "a100/0/BOOL.3",
                "a100/2/INT",
                "a100/6/REAL",
                "a100/10/BOOL",
                "a100/12/SINT"
            ]
        );
        let mut data = [0u8; 16];
        data[0] = 0b1000;
        data[2..4].copy_from_slice(&(-4i16).to_le_bytes());
        data[4..6].copy_from_slice(&10i16.to_le_bytes());
        data[6..10].copy_from_slice(&1.5f32.to_le_bytes());
        data[10] = 0b0000_0101;
        data[11] = 0b10;
        data[12] = 0xFF;
        let mut out = Collect::default();
        let wire = frame(&data);
        let d = p.decode(&wire, 0, &mut out).unwrap();
        assert_eq!(d.cip_sequence, 3);
        let flags = [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0];
        assert_eq!(
            out.0,
            [
                (0, vec![1.0]),
                (1, vec![-1.0, 6.0]),
                (2, vec![1.5]),
                (3, flags.to_vec()),
                (4, vec![-1.0])
            ]
        );
        // Nothing changed: nothing publishes.
        let mut again = Collect::default();
        p.decode(&frame(&data), 1, &mut again).unwrap();
        assert!(again.0.is_empty());
        // One array element changes: the whole array publishes.
        data[4] = 12;
        let mut changed = Collect::default();
        p.decode(&frame(&data), 2, &mut changed).unwrap();
        assert_eq!(changed.0, [(1, vec![-1.0, 7.0])]);
    }

    #[test]
    fn sample_ms_then_deadband_and_always_bypasses_the_deadband() {
        let mut a = spec("a", 0, CipType::Dint);
        a.deadband = Deadband::Absolute(10.0);
        let mut b = spec("b", 4, CipType::Dint);
        b.deadband = Deadband::Absolute(10.0);
        b.always = true;
        let mut p = plan(100, &[a, b]);
        let at = |v: i32, now: u64, p: &mut InputPlan| {
            let mut data = [0u8; 16];
            data[..4].copy_from_slice(&v.to_le_bytes());
            data[4..8].copy_from_slice(&v.to_le_bytes());
            let mut out = Collect::default();
            p.decode(&frame(&data), now, &mut out).unwrap();
            out.0.iter().map(|(f, _)| *f).collect::<Vec<_>>()
        };
        assert_eq!(at(0, 1000, &mut p), [0, 1]);
        assert_eq!(at(50, 1099, &mut p), Vec::<usize>::new()); // inside sampleMs
        assert_eq!(at(5, 1100, &mut p), [1]); // a: inside its deadband; b: always
        assert_eq!(at(50, 1150, &mut p), [0]); // b published at 1100
        assert_eq!(at(50, 1200, &mut p), [1]);
    }

    #[test]
    fn wrong_size_and_malformed_are_dropped_with_a_reason() {
        let mut p = plan(0, &[spec("a", 0, CipType::Int)]);
        let mut out = Collect::default();
        assert_eq!(
            p.decode(&frame(&[0; 15]), 0, &mut out).unwrap_err(),
            Reason::WrongSize
        );
        assert_eq!(
            p.decode(&[1, 2, 3], 0, &mut out).unwrap_err(),
            Reason::Truncated
        );
        assert!(out.0.is_empty());
    }

    #[test]
    fn plans_that_cannot_work_are_refused_naming_the_field() {
        let err = |specs: &[FieldSpec]| {
            InputPlan::new(1, 8, RealTimeFormat::Modeless, 0, specs)
                .unwrap_err()
                .to_string()
        };
        assert!(err(&[spec("x", 6, CipType::Dint)]).contains("\"x\": bytes 6..10 do not fit"));
        let mut arr = spec("arr", 0, CipType::Int);
        arr.array_count = Some(5);
        assert!(err(&[arr]).contains("\"arr\""));
        let mut bad_bit = spec("b", 0, CipType::Int);
        bad_bit.bit = Some(1);
        assert!(err(&[bad_bit]).contains("BOOL fields only"));
        let mut scaled_bool = spec("s", 0, CipType::Bool);
        scaled_bool.scale = Some(2.0);
        assert!(err(&[scaled_bool]).contains("numeric types only"));
        let twice = [spec("a", 0, CipType::Int), spec("b", 0, CipType::Int)];
        assert!(err(&twice).contains("signal id a1/0/INT"));
        let named = [spec("a", 0, CipType::Int), spec("a", 2, CipType::Int)];
        assert!(err(&named).contains("same name"));
        // Overlap is allowed: a DINT and one of its bits.
        let mut bit = spec("bit", 0, CipType::Bool);
        bit.bit = Some(0);
        assert!(InputPlan::new(
            1,
            8,
            RealTimeFormat::Modeless,
            0,
            &[spec("d", 0, CipType::Dint), bit]
        )
        .is_ok());
        assert!(InputPlan::new(
            1,
            8,
            RealTimeFormat::Heartbeat,
            0,
            &[spec("d", 0, CipType::Dint)]
        )
        .is_err());
        assert!(CipType::from_name("dint").is_ok() && CipType::from_name("STRING").is_err());
    }

    #[test]
    fn output_encode_unscales_rounds_and_checks_ranges() {
        let mut speed = spec("speed", 0, CipType::Int);
        speed.scale = Some(0.1);
        let mut bit = spec("go", 2, CipType::Bool);
        bit.bit = Some(1);
        let specs = [
            speed,
            bit,
            spec("big", 4, CipType::Ulint),
            spec("r", 12, CipType::Real),
        ];
        let out = OutputPlan::new(150, 16, RealTimeFormat::Header32, &specs).unwrap();
        let mut asm = [0u8; 16];
        out.encode(&mut asm, 0, &[OutValue::Float(12.34)]).unwrap();
        assert_eq!(i16::from_le_bytes([asm[0], asm[1]]), 123);
        out.encode(&mut asm, 1, &[OutValue::Bool(true)]).unwrap();
        assert_eq!(asm[2], 0b10);
        out.encode(&mut asm, 2, &[OutValue::Int(u64::MAX.into())])
            .unwrap();
        assert_eq!(&asm[4..12], &[0xFF; 8]);
        assert!(out.encode(&mut asm, 2, &[OutValue::Int(-1)]).is_err());
        assert!(out.encode(&mut asm, 0, &[OutValue::Float(4000.0)]).is_err());
        assert!(out
            .encode(&mut asm, 0, &[OutValue::Float(f64::NAN)])
            .is_err());
        assert!(out.encode(&mut asm, 1, &[OutValue::Int(1)]).is_err());
        assert!(out.encode(&mut asm, 3, &[OutValue::Float(1e300)]).is_err());
        out.encode(&mut asm, 3, &[OutValue::Float(2.5)]).unwrap();
        assert_eq!(
            f32::from_le_bytes([asm[12], asm[13], asm[14], asm[15]]),
            2.5
        );
        // Half to even, as Python's round().
        out.encode(&mut asm, 0, &[OutValue::Float(0.25)]).unwrap();
        assert_eq!(i16::from_le_bytes([asm[0], asm[1]]), 2);
        let hb = OutputPlan::new(151, 0, RealTimeFormat::Header32, &[]).unwrap();
        assert_eq!(hb.format, RealTimeFormat::Heartbeat);
    }

    proptest! {
        #[test]
        fn decode_never_panics(
            bytes in proptest::collection::vec(any::<u8>(), 0..120),
            now in any::<u64>(),
        ) {
            let mut arr = spec("arr", 3, CipType::Lreal);
            arr.array_count = Some(1);
            let mut p = plan(7, &[spec("a", 0, CipType::Ulint), arr, spec("c", 15, CipType::Usint)]);
            let mut out = Collect::default();
            let _ = p.decode(&bytes, now, &mut out);
            let mut framed = bytes.clone();
            framed.resize(16, 0);
            prop_assert!(p.decode(&frame(&framed[..16]), now, &mut out).is_ok());
        }
    }
}
