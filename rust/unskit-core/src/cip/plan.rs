//! Assembly plans: compiled once from an assembly's fields, then used per datagram.
//!
//! An [`InputPlan`] decodes the T-to-O assembly of each datagram and returns only the
//! fields due for publication: a field is eligible `sample_ms` after its last publication,
//! then `always` publishes it and `onChange` asks the deadband (an array publishes when any
//! element passes, and then all its elements become the last published ones). An
//! [`OutputPlan`] writes engineering values into an O-to-T assembly with range checks.

use crate::cip::frame::{datagram_data, parse_datagram, Datagram, RealTimeFormat, Reason};
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
    /// Per element: the least |new - last| that publishes a finite value, worked out when
    /// `last` is published (the deadband of [`Deadband::passes`] with its division done
    /// once per publication instead of once per datagram; 0 for none and from a last 0).
    cut: Vec<f64>,
    scratch: Vec<f64>,
}

/// A batch of `n` datagrams as columns ([`InputPlan::decode_columns`]): column `j` of
/// `values` holds element `j` (of all fields' elements) of every datagram, scaled, gated or
/// not (NaN for a dropped datagram); column `f` of `published` one 0/1 byte per datagram,
/// 1 where field `f` is due for publication.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ColumnBatch {
    /// Per datagram: 0 decoded, else 1 + the index of its [`Reason`] in [`Reason::ALL`].
    pub status: Vec<u8>,
    /// Elements x datagrams (column-major: `values[j * n + d]`); field `f` is columns
    /// `first(f)..first(f) + count`.
    pub values: Vec<f64>,
    /// Fields x datagrams (column-major: `published[f * n + d]`).
    pub published: Vec<u8>,
}

impl ColumnBatch {
    pub fn clear(&mut self) {
        self.status.clear();
        self.values.clear();
        self.published.clear();
    }
}

/// The status byte of a batch row: 0 decoded, else 1 + the reason's index.
pub fn status_code(outcome: Result<(), Reason>) -> u8 {
    match outcome {
        Ok(()) => 0,
        Err(reason) => 1 + Reason::ALL.iter().position(|r| *r == reason).unwrap_or(0) as u8,
    }
}

/// [`Deadband::passes`] with its threshold precomputed as `cut`: one comparison for every
/// kind while both values are finite.
#[inline(always)]
fn passes_cut(cut: f64, last: f64, value: f64) -> bool {
    if value.is_finite() && last.is_finite() {
        (value - last).abs() >= cut && value != last
    } else {
        value != last && !(value.is_nan() && last.is_nan())
    }
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
            cut: vec![0.0; elements],
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
        let mut scratch = std::mem::take(&mut self.scratch);
        for index in 0..self.fields.len() {
            let field = &self.fields[index];
            scratch.clear();
            scratch.extend((0..field.count).map(|k| field.scaling.apply(field.read_raw(data, k))));
            if self.due(index, now_ms, &scratch) && sink.publish(index, &scratch) {
                self.commit(index, now_ms, &scratch);
            }
        }
        self.scratch = scratch;
    }

    /// Elements of all fields: the width of a [`ColumnBatch`] row of values.
    pub fn elements(&self) -> usize {
        self.last.len()
    }

    /// Where field `index`'s elements start in a row of values.
    pub fn first(&self, index: usize) -> usize {
        self.fields[index].first
    }

    /// Many whole datagrams with their times, in arrival order, as columns in `out`
    /// (replacing what it held); the gates move exactly as with one
    /// [`decode`](Self::decode) per datagram.
    ///
    /// The work runs one field at a time down the batch (a field's gate depends only on
    /// its own history), so a field's type, offset and scaling are chosen once per batch,
    /// and each column is written and read contiguously.
    pub fn decode_columns<'a>(
        &mut self,
        datagrams: impl IntoIterator<Item = (&'a [u8], u64)>,
        out: &mut ColumnBatch,
    ) {
        self.decode_columns_from(datagrams, None, out);
    }

    /// [`decode_columns`](Self::decode_columns) of `blob`, whole datagrams back to back
    /// (a length that is not a multiple of one datagram leaves the rest as one more
    /// datagram, which is then dropped); `times` has one time per datagram. Reading at a
    /// fixed stride spares a pointer per value.
    pub fn decode_columns_contiguous(&mut self, blob: &[u8], times: &[u64], out: &mut ColumnBatch) {
        let whole = self.format.datagram_bytes(self.size);
        let datagrams = blob.chunks(whole.max(1)).zip(times.iter().copied());
        self.decode_columns_from(datagrams, Some(blob), out);
    }

    fn decode_columns_from<'a>(
        &mut self,
        datagrams: impl IntoIterator<Item = (&'a [u8], u64)>,
        blob: Option<&[u8]>,
        out: &mut ColumnBatch,
    ) {
        out.clear();
        let datagrams = datagrams.into_iter();
        let mut rows: Vec<Option<&'a [u8]>> = Vec::with_capacity(datagrams.size_hint().0);
        let mut times: Vec<u64> = Vec::with_capacity(datagrams.size_hint().0);
        out.status.reserve(datagrams.size_hint().0);
        for (datagram, now_ms) in datagrams {
            let data = datagram_data(datagram, self.format, self.size);
            out.status.push(match data {
                Some(_) => 0,
                None => status_code(parse_datagram(datagram, self.format, self.size).map(|_| ())),
            });
            rows.push(data);
            times.push(now_ms);
        }
        let n = rows.len();
        let every_row = rows.iter().all(Option::is_some);
        let (whole, start) = (
            self.format.datagram_bytes(self.size),
            18 + self.format.prefix_bytes(),
        );
        // Every datagram decoded from one buffer of n whole ones: read at a fixed stride.
        let strided = blob.filter(|b| every_row && b.len() == n * whole);
        let datas: Vec<&[u8]> = if every_row && strided.is_none() {
            rows.iter().flatten().copied().collect()
        } else {
            Vec::new()
        };
        out.values.reserve(n * self.elements());
        out.published.resize(n * self.fields.len(), 0);
        // The byte of each bit field's offset down the batch, read once for all the bit
        // fields it holds (eight flags of one byte cost one strided pass, not eight).
        let mut bit_bytes: Vec<(usize, Vec<u8>)> = Vec::new();
        for index in 0..self.fields.len() {
            let field = &self.fields[index];
            let (offset, size, bit) = (field.offset, field.ty.size(), field.bit);
            // Each element's column in turn (fields and elements are in `first` order):
            // read and scaled, NaN where the datagram was dropped.
            for k in 0..field.count {
                // Specialised for the usual batch (every datagram decoded) and scaling, so
                // the loop is a load, a conversion and a store.
                macro_rules! fill {
                    ($read:expr) => {{
                        let read = $read;
                        let scaling = field.scaling;
                        let (scale, shift) = scaling.factors();
                        if !every_row {
                            out.values.extend(rows.iter().map(|row| match row {
                                Some(data) => scaling.apply(read(data)),
                                None => f64::NAN,
                            }))
                        } else if let Some(blob) = strided {
                            let datas = blob.chunks_exact(whole).map(|d| &d[start..]);
                            if scaling.is_identity() {
                                out.values.extend(datas.map(|data| read(data)))
                            } else {
                                out.values
                                    .extend(datas.map(|data| read(data) * scale + shift))
                            }
                        } else if scaling.is_identity() {
                            out.values.extend(datas.iter().map(|data| read(data)))
                        } else {
                            out.values
                                .extend(datas.iter().map(|data| read(data) * scale + shift))
                        }
                    }};
                }
                macro_rules! typed {
                    ($t:ty) => {
                        fill!(|d: &[u8]| <$t>::from_le_bytes(bytes(d, offset + k * size)) as f64)
                    };
                }
                match field.ty {
                    CipType::Bool => match (bit, strided) {
                        (Some(bit), Some(blob)) => {
                            let at = match bit_bytes.iter().position(|(o, _)| *o == offset) {
                                Some(at) => at,
                                None => {
                                    let column =
                                        blob.chunks_exact(whole).map(|d| d[start + offset]);
                                    bit_bytes.push((offset, column.collect()));
                                    bit_bytes.len() - 1
                                }
                            };
                            // Contiguous bytes in, contiguous floats out: this vectorises.
                            let column = bit_bytes[at].1.iter();
                            out.values.extend(column.map(|&b| f64::from(b >> bit & 1)))
                        }
                        (Some(bit), None) => fill!(|d: &[u8]| f64::from(d[offset] >> bit & 1)),
                        (None, _) if field.is_array => {
                            fill!(|d: &[u8]| f64::from(d[offset + k / 8] >> (k % 8) & 1))
                        }
                        (None, _) => fill!(|d: &[u8]| f64::from(u8::from(d[offset] != 0))),
                    },
                    CipType::Sint => typed!(i8),
                    CipType::Usint => typed!(u8),
                    CipType::Int => typed!(i16),
                    CipType::Uint => typed!(u16),
                    CipType::Dint => typed!(i32),
                    CipType::Udint => typed!(u32),
                    CipType::Lint => typed!(i64),
                    CipType::Ulint => typed!(u64),
                    CipType::Real => typed!(f32),
                    CipType::Lreal => typed!(f64),
                }
            }
        }
        self.gate_columns(&rows, &times, every_row, &bit_bytes, out);
    }

    /// Every field's gate down its columns of `out.values`, flags into `out.published`.
    fn gate_columns(
        &mut self,
        rows: &[Option<&[u8]>],
        times: &[u64],
        every_row: bool,
        bit_bytes: &[(usize, Vec<u8>)],
        out: &mut ColumnBatch,
    ) {
        let n = times.len();
        if n == 0 {
            return;
        }
        let free = every_row && self.sample_ms == 0;
        for (index, published) in out.published.chunks_exact_mut(n).enumerate() {
            let field = &self.fields[index];
            let (first, count) = (field.first, field.count);
            let values = &out.values[first * n..(first + count) * n];
            let bytes = match field.bit {
                Some(bit) if free && !field.always => bit_bytes
                    .iter()
                    .find(|(offset, _)| *offset == field.offset)
                    .map(|(_, bytes)| (bytes, bit)),
                _ => None,
            };
            if let Some((bytes, bit)) = bytes {
                self.gate_bits(index, times, values, bytes, bit, published);
            } else if free && count > 1 {
                self.gate_array_every_row(index, times, values, published);
            } else if count > 1 {
                self.gate_array(index, rows, times, values, published);
            } else if free {
                self.gate_column_every_row(index, times, values, published);
            } else {
                self.gate_column_rows(index, rows, times, values, published);
            }
        }
    }

    /// The gate when every datagram decoded and no sampleMs holds a field back (the usual
    /// batch): after the first publication only the deadband decides, so a field without
    /// one publishes where its value changes (a comparison of neighbours, which vectorises)
    /// and a field with one runs a loop that keeps last and cut in registers.
    fn gate_column_every_row(
        &mut self,
        index: usize,
        times: &[u64],
        column: &[f64],
        published: &mut [u8],
    ) {
        let field = &self.fields[index];
        let (always, deadband, first) = (field.always, field.deadband, field.first);
        let (mut last, mut cut) = (self.last[first], self.cut[first]);
        let mut newest: Option<usize> = None;
        let mut start = 0;
        if self.published_ms[index].is_none() {
            let Some(&v) = column.first() else {
                return;
            };
            (last, cut, newest, start) = (v, cut_of(deadband, v), Some(0), 1);
            published[0] = 1;
        }
        let full = column;
        let (column, flags) = (&column[start..], &mut published[start..]);
        if always {
            flags.fill(1);
        } else if deadband == Deadband::None {
            if let (Some(&v), Some(flag)) = (column.first(), flags.first_mut()) {
                *flag = u8::from(changed(last, v));
            }
            for (flag, pair) in flags.iter_mut().skip(1).zip(column.windows(2)) {
                *flag = u8::from(changed(pair[0], pair[1]));
            }
        } else {
            for (flag, &v) in flags.iter_mut().zip(column) {
                if passes_cut(cut, last, v) {
                    (last, cut) = (v, cut_of(deadband, v));
                    *flag = 1;
                }
            }
        }
        if let Some(d) = newest_flag(flags) {
            newest = Some(start + d);
        }
        if let Some(d) = newest {
            // `last` was kept by the deadband loop; elsewhere the newest published value.
            if always || deadband == Deadband::None {
                last = full[d];
                cut = cut_of(deadband, last);
            }
            self.last[first] = last;
            self.cut[first] = cut;
            self.published_ms[index] = Some(times[d]);
        }
    }

    /// [`gate_column_every_row`](Self::gate_column_every_row) of a bit field that is not
    /// `always` (a BOOL takes no deadband): its value changes exactly where its bit does, so
    /// the flags come from the source bytes, sixteen to an instruction, not from the floats.
    fn gate_bits(
        &mut self,
        index: usize,
        times: &[u64],
        column: &[f64],
        bytes: &[u8],
        bit: u8,
        published: &mut [u8],
    ) {
        let first = self.fields[index].first;
        let (Some(&head), Some(flag)) = (bytes.first(), published.first_mut()) else {
            return;
        };
        let fresh = self.published_ms[index].is_none();
        *flag = u8::from(fresh || changed(self.last[first], f64::from(head >> bit & 1)));
        let pairs = bytes.iter().zip(&bytes[1..]);
        for (flag, (&before, &now)) in published[1..].iter_mut().zip(pairs) {
            *flag = (before ^ now) >> bit & 1;
        }
        if let Some(d) = newest_flag(published) {
            self.last[first] = column[d];
            self.cut[first] = cut_of(Deadband::None, column[d]);
            self.published_ms[index] = Some(times[d]);
        }
    }

    /// The gate of a one-element field down its column, row by row.
    fn gate_column_rows(
        &mut self,
        index: usize,
        rows: &[Option<&[u8]>],
        times: &[u64],
        column: &[f64],
        published: &mut [u8],
    ) {
        let field = &self.fields[index];
        let (always, deadband, sample_ms) = (field.always, field.deadband, self.sample_ms);
        let (mut last, mut cut) = (self.last[field.first], self.cut[field.first]);
        let mut at = self.published_ms[index];
        for (((row, &now_ms), &v), flag) in rows.iter().zip(times).zip(column).zip(published) {
            if row.is_none() {
                continue;
            }
            let due = match at {
                None => true,
                Some(t) if now_ms.saturating_sub(t) < sample_ms => false,
                Some(_) => always || passes_cut(cut, last, v),
            };
            if due {
                last = v;
                fill_cuts(deadband, std::slice::from_mut(&mut cut), &[v]);
                at = Some(now_ms);
                *flag = 1;
            }
        }
        self.last[field.first] = last;
        self.cut[field.first] = cut;
        self.published_ms[index] = at;
    }

    /// [`gate_array`](Self::gate_array) when every datagram decoded and no sampleMs holds
    /// a field back, with last and cut read in place.
    fn gate_array_every_row(
        &mut self,
        index: usize,
        times: &[u64],
        columns: &[f64],
        published: &mut [u8],
    ) {
        let n = times.len();
        let field = &self.fields[index];
        let (first, count, always, deadband) =
            (field.first, field.count, field.always, field.deadband);
        let last = &mut self.last[first..first + count];
        let cut = &mut self.cut[first..first + count];
        let mut at = self.published_ms[index];
        for (d, flag) in published.iter_mut().enumerate().take(n) {
            let due = at.is_none()
                || always
                || (0..count).any(|k| passes_cut(cut[k], last[k], columns[k * n + d]));
            if due {
                for k in 0..count {
                    let v = columns[k * n + d];
                    (last[k], cut[k]) = (v, cut_of(deadband, v));
                }
                at = Some(times[d]);
                *flag = 1;
            }
        }
        self.published_ms[index] = at;
    }

    /// The gate of an array field: due when any element passes, then all are published.
    fn gate_array(
        &mut self,
        index: usize,
        rows: &[Option<&[u8]>],
        times: &[u64],
        columns: &[f64],
        published: &mut [u8],
    ) {
        let n = rows.len();
        let mut row = vec![0.0; self.fields[index].count];
        for (d, (data, &now_ms)) in rows.iter().zip(times).enumerate() {
            if data.is_none() {
                continue;
            }
            for (k, v) in row.iter_mut().enumerate() {
                *v = columns[k * n + d];
            }
            if self.due(index, now_ms, &row) {
                self.commit(index, now_ms, &row);
                published[d] = 1;
            }
        }
    }

    /// Whether field `index` publishes `values` now: `sample_ms` after its last
    /// publication, then the first time, `always`, or any element past its deadband.
    #[inline(always)]
    fn due(&self, index: usize, now_ms: u64, values: &[f64]) -> bool {
        let field = &self.fields[index];
        match self.published_ms[index] {
            None => true,
            Some(at) if now_ms.saturating_sub(at) < self.sample_ms => false,
            Some(_) if field.always => true,
            Some(_) => {
                let span = field.first..field.first + field.count;
                self.last[span.clone()]
                    .iter()
                    .zip(&self.cut[span])
                    .zip(values)
                    .any(|((&last, &cut), &value)| passes_cut(cut, last, value))
            }
        }
    }

    #[inline(always)]
    fn commit(&mut self, index: usize, now_ms: u64, values: &[f64]) {
        let field = &self.fields[index];
        let span = field.first..field.first + field.count;
        self.last[span.clone()].copy_from_slice(values);
        fill_cuts(field.deadband, &mut self.cut[span], values);
        self.published_ms[index] = Some(now_ms);
    }
}

/// The index of the last 1 in `flags` (0 or 1 each), found a block at a time from the end:
/// a field that seldom publishes would otherwise be scanned a byte at a time.
fn newest_flag(flags: &[u8]) -> Option<usize> {
    let mut end = flags.len();
    for block in flags.rchunks(32) {
        if block.iter().fold(0, |any, &f| any | f) != 0 {
            let at = block.iter().rposition(|&f| f != 0)?;
            return Some(end - block.len() + at);
        }
        end -= block.len();
    }
    None
}

/// Whether `value` differs from `last` (NaN repeating is no change).
#[inline(always)]
fn changed(last: f64, value: f64) -> bool {
    value != last && !(value.is_nan() && last.is_nan())
}

/// The cut of one element just published as `value` (see `InputPlan::cut`).
#[inline(always)]
fn cut_of(deadband: Deadband, value: f64) -> f64 {
    match deadband {
        Deadband::None => 0.0,
        Deadband::Absolute(t) => t,
        Deadband::Percent(p) => value.abs() * p / 100.0,
    }
}

/// The cut of each element just published as `values` (see `InputPlan::cut`).
#[inline(always)]
fn fill_cuts(deadband: Deadband, cuts: &mut [f64], values: &[f64]) {
    match deadband {
        Deadband::None => cuts.fill(0.0),
        Deadband::Absolute(t) => cuts.fill(t),
        Deadband::Percent(p) => {
            for (cut, &value) in cuts.iter_mut().zip(values) {
                *cut = value.abs() * p / 100.0;
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

    fn gated_specs() -> Vec<FieldSpec> {
        let mut bit = spec("bit", 0, CipType::Bool);
        bit.bit = Some(1);
        let mut int = spec("int", 2, CipType::Int);
        int.scale = Some(0.5);
        int.deadband = Deadband::Absolute(2.0);
        let mut real = spec("real", 4, CipType::Real);
        real.deadband = Deadband::Percent(10.0);
        let mut arr = spec("arr", 8, CipType::Sint);
        arr.array_count = Some(3);
        arr.deadband = Deadband::Absolute(1.0);
        arr.value_offset = Some(-1.0);
        let mut always = spec("always", 11, CipType::Usint);
        always.always = true;
        vec![bit, int, real, arr, always, spec("last", 12, CipType::Dint)]
    }

    #[test]
    fn columns_hold_every_element_and_flag_what_decode_publishes() {
        let mut single = plan(5, &gated_specs());
        let mut batch = plan(5, &gated_specs());
        let mut data = [0u8; 16];
        data[4..8].copy_from_slice(&f32::NAN.to_le_bytes());
        let frames = [frame(&data), frame(&data[..15]), {
            data[2] = 9;
            data[8] = 0xFF;
            frame(&data)
        }];
        let mut out = ColumnBatch::default();
        batch.decode_columns(frames.iter().map(|f| (&f[..], 10)), &mut out);
        assert_eq!(out.status, [0, 1 + 7, 0]); // wrong_size is the eighth reason
        assert_eq!(batch.elements(), 8);
        assert_eq!(batch.first(3), 3);
        // The first datagram publishes every field; the dropped one nothing and NaNs; the
        // third (sampleMs 5 not yet past) nothing, though its values are all there.
        // Column-major: field f's flags are published[f * 3..][..3], element j's values
        // values[j * 3..][..3].
        assert_eq!(out.published, [[1u8, 0, 0]; 6].concat());
        let at = |j: usize, d: usize| out.values[j * 3 + d];
        assert!((0..8).all(|j| at(j, 1).is_nan()));
        assert_eq!(at(1, 2), 4.5);
        assert_eq!([at(3, 2), at(4, 2), at(5, 2)], [-2.0, -1.0, -1.0]);
        let mut sink = Collect::default();
        single.decode(&frames[0], 10, &mut sink).unwrap();
        assert_eq!(sink.0.len(), 6);
    }

    fn check_columns(
        sample_ms: u64,
        payloads: &[Vec<u8>],
        steps: &[u64],
    ) -> Result<(), TestCaseError> {
        check_columns_of(&gated_specs(), false, sample_ms, payloads, steps)
    }

    /// Bit fields sharing a byte (some `always`), a bit alone in a byte at an odd offset,
    /// a word overlapping bits, and an array: the paths that read a byte once for its bits.
    fn bit_specs() -> Vec<FieldSpec> {
        let mut specs = Vec::new();
        for bit in [0u8, 1, 2, 5, 7] {
            let mut s = spec(&format!("b0.{bit}"), 0, CipType::Bool);
            s.bit = Some(bit);
            s.always = bit == 2;
            specs.push(s);
        }
        let mut odd = spec("b5.6", 5, CipType::Bool);
        odd.bit = Some(6);
        specs.push(odd);
        let mut high = spec("b5.3", 5, CipType::Bool);
        high.bit = Some(3);
        specs.push(high);
        let mut word = spec("word", 4, CipType::Uint);
        word.deadband = Deadband::Absolute(3.0);
        specs.push(word);
        let mut arr = spec("flags", 6, CipType::Bool);
        arr.array_count = Some(9);
        specs.push(arr);
        let mut ints = spec("ints", 8, CipType::Int);
        ints.array_count = Some(3);
        ints.deadband = Deadband::Percent(20.0);
        specs.push(ints);
        specs
    }

    /// Batches of `payloads` (as one buffer of whole datagrams when `contiguous`) against
    /// one [`InputPlan::decode`] per datagram: the same status, flags and values bit for bit.
    fn check_columns_of(
        specs: &[FieldSpec],
        contiguous: bool,
        sample_ms: u64,
        payloads: &[Vec<u8>],
        steps: &[u64],
    ) -> Result<(), TestCaseError> {
        let mut single = plan(sample_ms, specs);
        let mut batch = plan(sample_ms, specs);
        let frames: Vec<Vec<u8>> = payloads.iter().map(|p| frame(p)).collect();
        let mut now = 0;
        let times: Vec<u64> = steps
            .iter()
            .take(frames.len())
            .map(|s| {
                now += s;
                now
            })
            .collect();
        // Two batches: the second starts from the gates the first left.
        let half = frames.len() / 2;
        for (from, to) in [(0, half), (half, frames.len())] {
            let mut out = ColumnBatch::default();
            if contiguous {
                let blob = frames[from..to].concat();
                batch.decode_columns_contiguous(&blob, &times[from..to], &mut out);
            } else {
                let pairs = frames[from..to].iter().map(|f| &f[..]);
                batch.decode_columns(pairs.zip(times[from..to].iter().copied()), &mut out);
            }
            let (elements, fields, n) = (batch.elements(), batch.fields().len(), to - from);
            for d in 0..n {
                let mut sink = Collect::default();
                let outcome = single
                    .decode(&frames[from + d], times[from + d], &mut sink)
                    .map(|_| ());
                prop_assert_eq!(out.status[d], status_code(outcome));
                let row: Vec<f64> = (0..elements).map(|j| out.values[j * n + d]).collect();
                let published: Vec<usize> = (0..fields)
                    .filter(|&i| out.published[i * n + d] == 1)
                    .collect();
                prop_assert_eq!(
                    &published,
                    &sink.0.iter().map(|(i, _)| *i).collect::<Vec<_>>()
                );
                for (i, values) in &sink.0 {
                    let first = batch.first(*i);
                    let got: Vec<u64> = row[first..first + values.len()]
                        .iter()
                        .map(|v| v.to_bits())
                        .collect();
                    prop_assert_eq!(got, values.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
                }
            }
        }
        Ok(())
    }

    #[test]
    fn one_buffer_of_datagrams_decodes_as_the_slices_do() {
        let payloads: Vec<Vec<u8>> = (0..50u8).map(|i| vec![i % 7; 16]).collect();
        let frames: Vec<Vec<u8>> = payloads.iter().map(|p| frame(p)).collect();
        let times: Vec<u64> = (0..50).collect();
        let blob = frames.concat();
        for sample_ms in [0, 3] {
            let (mut a, mut b) = (
                plan(sample_ms, &gated_specs()),
                plan(sample_ms, &gated_specs()),
            );
            let (mut from_slices, mut from_blob) = (ColumnBatch::default(), ColumnBatch::default());
            let slices = frames.iter().map(|f| &f[..]).zip(times.iter().copied());
            a.decode_columns(slices, &mut from_slices);
            b.decode_columns_contiguous(&blob, &times, &mut from_blob);
            assert_eq!(from_blob, from_slices);
        }
        // A ragged tail is one more, dropped, datagram.
        let mut p = plan(0, &gated_specs());
        let mut out = ColumnBatch::default();
        p.decode_columns_contiguous(&blob[..blob.len() - 3], &times, &mut out);
        assert_eq!(out.status.len(), 50);
        assert_eq!(out.status[49], status_code(Err(Reason::Truncated)));
    }

    #[test]
    fn bit_fields_of_one_byte_flag_each_bit_where_it_changes() {
        let mut p = plan(0, &bit_specs());
        let (mut data, mut blob) = ([0u8; 16], Vec::new());
        for byte in [
            0b1000_0001u8,
            0b1000_0001,
            0b1000_0011,
            0b0000_0011,
            0b0010_0011,
        ] {
            data[0] = byte;
            blob.extend(frame(&data));
        }
        let mut out = ColumnBatch::default();
        p.decode_columns_contiguous(&blob, &[0, 1, 2, 3, 4], &mut out);
        let flags = |f: usize| &out.published[f * 5..(f + 1) * 5];
        assert_eq!(flags(0), [1, 0, 0, 0, 0]); // bit 0: set throughout
        assert_eq!(flags(1), [1, 0, 1, 0, 0]); // bit 1: rises at the third
        assert_eq!(flags(2), [1, 1, 1, 1, 1]); // bit 2: always
        assert_eq!(flags(3), [1, 0, 0, 0, 1]); // bit 5: rises at the fifth
        assert_eq!(flags(4), [1, 0, 0, 1, 0]); // bit 7: falls at the fourth
        assert_eq!(&out.values[4 * 5..5 * 5], [1.0, 1.0, 1.0, 0.0, 0.0]);
        // The next batch starts from the last published bits: nothing changed, nothing due.
        let newest = &blob[blob.len() - blob.len() / 5..];
        let mut again = ColumnBatch::default();
        p.decode_columns_contiguous(newest, &[5], &mut again);
        assert_eq!(&again.published[..5], [0, 0, 1, 0, 0]);
        // An empty batch: no rows, the gates untouched.
        let mut empty = ColumnBatch::default();
        p.decode_columns_contiguous(&[], &[], &mut empty);
        assert!(empty.status.is_empty() && empty.values.is_empty() && empty.published.is_empty());
        p.decode_columns_contiguous(newest, &[6], &mut again);
        assert_eq!(&again.published[..5], [0, 0, 1, 0, 0]);
    }

    proptest! {
        #[test]
        fn columns_agree_with_one_decode_per_datagram(
            payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 15..17), 1..40),
            steps in proptest::collection::vec(0u64..4, 40),
            sample_ms in 0u64..3,
        ) {
            check_columns(sample_ms, &payloads, &steps)?;
        }

        #[test]
        fn columns_agree_when_every_datagram_decodes_and_nothing_is_held_back(
            payloads in proptest::collection::vec(proptest::collection::vec(
                prop_oneof![3 => 0u8..3, 1 => any::<u8>()], 16), 1..40),
        ) {
            // Few distinct bytes: values repeat, so the gates both pass and hold.
            check_columns(0, &payloads, &[1; 40])?;
        }

        #[test]
        fn one_buffer_of_bit_fields_agrees_with_one_decode_per_datagram(
            payloads in proptest::collection::vec(proptest::collection::vec(
                prop_oneof![3 => 0u8..4, 1 => any::<u8>()], 16), 0..40),
            steps in proptest::collection::vec(0u64..4, 40),
            sample_ms in 0u64..3,
            contiguous in any::<bool>(),
        ) {
            check_columns_of(&bit_specs(), contiguous, sample_ms, &payloads, &steps)?;
        }

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
