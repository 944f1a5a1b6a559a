//! Scaling and deadband kernels: `raw * scale + offset`, and the change gate that decides
//! whether a (scaled) sample is due for publication.
//!
//! Every value is an `f64`; the rule is the one `docs/decisions.md` states ("Change gate")
//! and `python/unskit/_reference/signal.py` restates in plain Python, bit for bit.

use crate::error::CoreError;

/// How a sample is compared with the last published value of its signal.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Deadband {
    /// Any change publishes.
    None,
    /// |new - last| >= value publishes.
    Absolute(f64),
    /// |new - last| >= value% of |last| publishes; from a last value of 0 any change does.
    Percent(f64),
}

impl Deadband {
    /// The deadband of a configuration: `kind` is none, absolute or percent, `value` >= 0.
    pub fn from_config(kind: &str, value: f64) -> Result<Self, CoreError> {
        if !(value.is_finite() && value >= 0.0) {
            return Err(CoreError::InvalidSignal(format!(
                "deadband value must be a finite number >= 0, got {value}"
            )));
        }
        match kind {
            "none" => Ok(Deadband::None),
            "absolute" => Ok(Deadband::Absolute(value)),
            "percent" => Ok(Deadband::Percent(value)),
            other => Err(CoreError::InvalidSignal(format!(
                "deadband type must be none, absolute or percent, got {other:?}"
            ))),
        }
    }

    /// Whether `value` differs enough from `last` (the last published value) to publish.
    /// NaN and infinities publish on every transition and never on a repeat.
    #[inline]
    pub fn passes(self, last: f64, value: f64) -> bool {
        let threshold = match self {
            Deadband::None => return value != last && !(value.is_nan() && last.is_nan()),
            Deadband::Absolute(t) => t,
            Deadband::Percent(p) => {
                if !value.is_finite() || !last.is_finite() || last == 0.0 {
                    return value != last && !(value.is_nan() && last.is_nan());
                }
                last.abs() * p / 100.0
            }
        };
        if !value.is_finite() || !last.is_finite() {
            return value != last && !(value.is_nan() && last.is_nan());
        }
        (value - last).abs() >= threshold && value != last
    }
}

/// `raw * scale + offset`; absent both, the raw value itself (so -0.0 stays -0.0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scaling {
    scale: f64,
    offset: f64,
    identity: bool,
}

impl Scaling {
    pub const IDENTITY: Scaling = Scaling {
        scale: 1.0,
        offset: 0.0,
        identity: true,
    };

    /// A missing scale is 1, a missing offset 0; both missing is the identity.
    pub fn new(scale: Option<f64>, offset: Option<f64>) -> Result<Self, CoreError> {
        for (name, v) in [("scale", scale), ("offset", offset)] {
            if let Some(v) = v {
                if !v.is_finite() {
                    return Err(CoreError::InvalidSignal(format!(
                        "{name} must be a finite number, got {v}"
                    )));
                }
            }
        }
        if scale.is_none() && offset.is_none() {
            return Ok(Scaling::IDENTITY);
        }
        Ok(Scaling {
            scale: scale.unwrap_or(1.0),
            offset: offset.unwrap_or(0.0),
            identity: false,
        })
    }

    #[inline]
    pub fn apply(self, raw: f64) -> f64 {
        if self.identity {
            raw
        } else {
            raw * self.scale + self.offset
        }
    }

    /// Both scale and offset absent: the raw value itself.
    pub fn is_identity(self) -> bool {
        self.identity
    }

    /// (scale, offset) with their defaults, 1 and 0.
    pub fn factors(self) -> (f64, f64) {
        (self.scale, self.offset)
    }

    /// Element-wise, in place.
    pub fn apply_all(self, values: &mut [f64]) {
        if !self.identity {
            for v in values {
                *v = *v * self.scale + self.offset;
            }
        }
    }
}

/// One signal's settings in a [`SignalBank`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SignalConfig {
    pub scaling: Scaling,
    pub deadband: Deadband,
    /// publishMode `always`: every sample publishes, the deadband is bypassed.
    pub always: bool,
}

/// Hot state of one signal, one cache line (never two). The gate is written without a branch on its outcome: whether
/// a sample publishes is as random as the signal, so a branch on it mispredicts often;
/// selects do not.
#[derive(Debug, Clone, Copy)]
#[repr(align(64))]
struct Slot {
    scale: f64,
    /// The identity scaling is `raw * 1 + -0`, exact for every raw value (-0.0 included),
    /// so no signal needs a branch on whether it scales.
    offset: f64,
    last: f64,
    /// The least |new - last| that publishes a finite sample, worked out when `last` is
    /// published as `|last| * percent / 100 + absolute` (one of the two is 0): the
    /// absolute threshold; the percent one, bit for bit the documented expression (0 from
    /// a last of 0: any change); 0 for none. Used only while `last` is finite.
    cut: f64,
    percent: f64,
    absolute: f64,
    /// The next sample publishes whatever it is: no last value yet, or publishMode always.
    force: bool,
    always: bool,
    has_last: bool,
}

impl Slot {
    fn new(c: SignalConfig) -> Self {
        let (percent, absolute) = match c.deadband {
            Deadband::None => (0.0, 0.0),
            Deadband::Absolute(t) => (0.0, t),
            Deadband::Percent(p) => (p, 0.0),
        };
        let (scale, offset) = if c.scaling.identity {
            (1.0, -0.0)
        } else {
            (c.scaling.scale, c.scaling.offset)
        };
        Slot {
            scale,
            offset,
            last: 0.0,
            cut: 0.0,
            percent,
            absolute,
            force: true,
            always: c.always,
            has_last: false,
        }
    }

    /// [`Deadband::passes`] after the first-sample and `always` rules: with `cut` the
    /// finite case is one comparison for every kind (none has cut 0, so it is `value !=
    /// last`; percent from a last of 0 likewise). Decides only; `commit` publishes.
    #[inline(always)]
    fn gate(&self, raw: f64) -> (bool, f64) {
        let value = raw * self.scale + self.offset;
        let last = self.last;
        let finite = value.is_finite() & last.is_finite();
        let moved = (value - last).abs() >= self.cut;
        let changed = (value != last) & !(value.is_nan() & last.is_nan());
        (self.force | (changed & (!finite | moved)), value)
    }

    /// Makes `value` the last published value when `ok`, without branching on `ok`.
    #[inline(always)]
    fn commit(&mut self, ok: bool, value: f64) {
        let cut = value.abs() * self.percent / 100.0 + self.absolute;
        self.last = if ok { value } else { self.last };
        self.cut = if ok { cut } else { self.cut };
        self.has_last |= ok;
        // A sample that did not publish was not forced, and one that did leaves `always`.
        self.force = self.always;
    }

    #[inline(always)]
    fn offer(&mut self, raw: f64) -> (bool, f64) {
        let (ok, value) = self.gate(raw);
        self.commit(ok, value);
        (ok, value)
    }
}

/// N signals' settings and last published values: the state of the change gate.
#[derive(Debug, Clone)]
pub struct SignalBank {
    slots: Vec<Slot>,
}

impl SignalBank {
    pub fn new(configs: impl IntoIterator<Item = SignalConfig>) -> Self {
        SignalBank {
            slots: configs.into_iter().map(Slot::new).collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The last published (scaled) value of signal `index`, if any.
    pub fn last(&self, index: usize) -> Option<f64> {
        self.slots
            .get(index)
            .and_then(|s| s.has_last.then_some(s.last))
    }

    /// Forgets every signal's last published value (the next sample of each publishes).
    pub fn reset(&mut self) {
        for slot in &mut self.slots {
            slot.has_last = false;
            slot.force = true;
        }
    }

    /// Forgets one signal's last published value.
    pub fn reset_one(&mut self, index: usize) -> Result<(), CoreError> {
        let len = self.slots.len();
        let slot = self
            .slots
            .get_mut(index)
            .ok_or_else(|| out_of_range(index, len))?;
        slot.has_last = false;
        slot.force = true;
        Ok(())
    }

    /// Scales one raw sample of signal `index` and passes it through the gate; a sample
    /// that passes becomes the signal's last published value.
    #[inline]
    pub fn offer(&mut self, index: usize, raw: f64) -> Result<(bool, f64), CoreError> {
        let len = self.slots.len();
        let slot = self
            .slots
            .get_mut(index)
            .ok_or_else(|| out_of_range(index, len))?;
        Ok(slot.offer(raw))
    }

    /// One sample of an array signal whose elements occupy slots `start..start + n`: the
    /// array passes when any element passes, and then every element's scaled value becomes
    /// its last published value (so the array is compared as it was last published).
    /// `scaled` receives the n scaled values.
    pub fn offer_array(
        &mut self,
        start: usize,
        raws: &[f64],
        scaled: &mut Vec<f64>,
    ) -> Result<bool, CoreError> {
        let len = self.slots.len();
        let end = start
            .checked_add(raws.len())
            .filter(|&end| end <= len)
            .ok_or_else(|| out_of_range(start.saturating_add(raws.len()), len))?;
        scaled.clear();
        let mut any = false;
        for (slot, &raw) in self.slots[start..end].iter().zip(raws) {
            let (ok, value) = slot.gate(raw);
            any |= ok;
            scaled.push(value);
        }
        for (slot, &value) in self.slots[start..end].iter_mut().zip(scaled.iter()) {
            slot.commit(any, value);
        }
        Ok(any)
    }

    /// The batch form of [`offer`](Self::offer), in arrival order: `passed[i]` (0 or 1)
    /// and `scaled[i]` for sample `i`. Every index is checked before any state changes, so
    /// a bad index leaves the bank as it was.
    pub fn offer_batch<I: SignalIndex>(
        &mut self,
        indices: &[I],
        raws: &[f64],
        passed: &mut Vec<u8>,
        scaled: &mut Vec<f64>,
    ) -> Result<(), CoreError> {
        passed.clear();
        scaled.clear();
        self.offer_batch_append(indices, raws, passed, scaled)
    }

    /// [`offer_batch`](Self::offer_batch) appending to `passed` and `scaled`, so a caller
    /// can feed a long batch in chunks that stay in cache.
    pub fn offer_batch_append<I: SignalIndex>(
        &mut self,
        indices: &[I],
        raws: &[f64],
        passed: &mut Vec<u8>,
        scaled: &mut Vec<f64>,
    ) -> Result<(), CoreError> {
        if indices.len() != raws.len() {
            return Err(CoreError::InvalidSignal(format!(
                "{} signal indices for {} values",
                indices.len(),
                raws.len()
            )));
        }
        self.check_indices(indices)?;
        passed.reserve(raws.len());
        scaled.reserve(raws.len());
        let slots = &mut self.slots[..];
        for (&i, &raw) in indices.iter().zip(raws) {
            // Every index was checked above; the remaining bounds check is predictable.
            let (ok, value) = slots[i.unchecked()].offer(raw);
            passed.push(ok as u8);
            scaled.push(value);
        }
        Ok(())
    }

    /// An error naming the first index that addresses no signal of this bank.
    pub fn check_indices<I: SignalIndex>(&self, indices: &[I]) -> Result<(), CoreError> {
        let len = self.slots.len();
        match indices.iter().find(|i| i.checked(len).is_none()) {
            Some(bad) => Err(CoreError::InvalidSignal(format!(
                "signal index {bad} out of range for a bank of {len} signals"
            ))),
            None => Ok(()),
        }
    }
}

/// An integer type signal indices arrive in: NumPy's int32 and int64 are read as they
/// are, without a pass that narrows them first.
pub trait SignalIndex: Copy + std::fmt::Display {
    /// The index when it addresses one of `len` signals.
    fn checked(self, len: usize) -> Option<usize>;
    /// The index of a value `checked` accepted.
    fn unchecked(self) -> usize;
}

macro_rules! signal_index {
    ($($t:ty),+) => {
        $(
            impl SignalIndex for $t {
                #[inline(always)]
                fn checked(self, len: usize) -> Option<usize> {
                    usize::try_from(self).ok().filter(|&i| i < len)
                }
                #[inline(always)]
                fn unchecked(self) -> usize {
                    self as usize
                }
            }
        )+
    };
}

signal_index!(u32, i32, i64);

fn out_of_range(index: usize, len: usize) -> CoreError {
    CoreError::InvalidSignal(format!(
        "signal index {index} out of range for a bank of {len} signals"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bank(deadband: Deadband) -> SignalBank {
        SignalBank::new([SignalConfig {
            scaling: Scaling::IDENTITY,
            deadband,
            always: false,
        }])
    }

    fn run(b: &mut SignalBank, values: &[f64]) -> Vec<bool> {
        values.iter().map(|&v| b.offer(0, v).unwrap().0).collect()
    }

    #[test]
    fn first_sample_always_publishes_then_none_needs_a_change() {
        let mut b = bank(Deadband::None);
        assert_eq!(
            run(&mut b, &[1.0, 1.0, 2.0, 2.0]),
            [true, false, true, false]
        );
    }

    #[test]
    fn an_array_passes_when_any_element_passes_and_then_all_are_last() {
        let config = SignalConfig {
            scaling: Scaling::new(Some(2.0), None).unwrap(),
            deadband: Deadband::Absolute(1.0),
            always: false,
        };
        let mut b = SignalBank::new([config; 3]);
        let mut out = Vec::new();
        assert!(
            b.offer_array(0, &[0.0, 0.0, 0.0], &mut out).unwrap(),
            "first"
        );
        assert!(!b.offer_array(0, &[0.2, 0.2, 0.2], &mut out).unwrap());
        assert_eq!(
            b.last(1),
            Some(0.0),
            "nothing committed when nothing passes"
        );
        assert!(b.offer_array(0, &[0.2, 0.6, 0.2], &mut out).unwrap());
        assert_eq!(out, [0.4, 1.2, 0.4]);
        assert_eq!(
            b.last(0),
            Some(0.4),
            "every element committed with the array"
        );
        assert!(
            b.offer_array(1, &[1.0, 1.0, 1.0], &mut out).is_err(),
            "past the bank"
        );
    }

    #[test]
    fn absolute_compares_with_last_published_not_last_seen() {
        let mut b = bank(Deadband::Absolute(1.0));
        // 0 -> 0.6 (no) -> 1.0 (|1-0| >= 1 yes) -> 1.9 (no) -> 2.0 (yes)
        assert_eq!(
            run(&mut b, &[0.0, 0.6, 1.0, 1.9, 2.0]),
            [true, false, true, false, true]
        );
    }

    #[test]
    fn percent_is_relative_to_last_published_and_any_change_from_zero() {
        let mut b = bank(Deadband::Percent(10.0));
        assert_eq!(
            run(&mut b, &[100.0, 109.0, 110.0, 0.0, 0.0, 0.001]),
            [true, false, true, true, false, true]
        );
        let mut neg = bank(Deadband::Percent(10.0));
        assert_eq!(run(&mut neg, &[-100.0, -95.0, -89.0]), [true, false, true]);
    }

    #[test]
    fn nan_and_infinities_publish_on_transitions_only() {
        for db in [
            Deadband::None,
            Deadband::Absolute(5.0),
            Deadband::Percent(50.0),
        ] {
            let mut b = bank(db);
            let inf = f64::INFINITY;
            assert_eq!(
                run(
                    &mut b,
                    &[f64::NAN, f64::NAN, 1.0, f64::NAN, inf, inf, -inf, 1.0]
                ),
                [true, false, true, true, true, false, true, true],
                "{db:?}"
            );
        }
    }

    #[test]
    fn zero_threshold_and_signed_zero() {
        let mut b = bank(Deadband::Absolute(0.0));
        assert_eq!(run(&mut b, &[0.0, -0.0, 1e-300]), [true, false, true]);
    }

    #[test]
    fn always_bypasses_the_deadband_and_scaling_applies_first() {
        let mut b = SignalBank::new([SignalConfig {
            scaling: Scaling::new(Some(2.0), Some(1.0)).unwrap(),
            deadband: Deadband::Absolute(100.0),
            always: true,
        }]);
        assert_eq!(b.offer(0, 3.0).unwrap(), (true, 7.0));
        assert_eq!(b.offer(0, 3.0).unwrap(), (true, 7.0));
    }

    #[test]
    fn batch_checks_every_index_before_touching_state() {
        let mut b = bank(Deadband::None);
        let (mut p, mut s) = (Vec::new(), Vec::new());
        assert!(b.offer_batch(&[0, 1], &[1.0, 2.0], &mut p, &mut s).is_err());
        assert_eq!(b.last(0), None);
        assert!(b.offer_batch(&[0], &[1.0, 2.0], &mut p, &mut s).is_err());
        b.offer_batch(&[0, 0, 0], &[1.0, 1.0, 3.0], &mut p, &mut s)
            .unwrap();
        assert_eq!(p, [1, 0, 1]);
        assert_eq!(s, [1.0, 1.0, 3.0]);
        b.reset();
        assert_eq!(b.offer(0, 3.0).unwrap(), (true, 3.0));
    }

    #[test]
    fn identity_keeps_negative_zero_and_reset_publishes_again() {
        let mut b = bank(Deadband::Absolute(1.0));
        let (ok, v) = b.offer(0, -0.0).unwrap();
        assert!(ok && v.to_bits() == (-0.0f64).to_bits());
        assert_eq!(b.offer(0, 0.5).unwrap(), (false, 0.5));
        b.reset_one(0).unwrap();
        assert_eq!(b.offer(0, 0.5).unwrap(), (true, 0.5));
    }

    /// The straightforward gate the branch-free kernel must equal: scale, then first
    /// sample / always / [`Deadband::passes`] against the last published value.
    fn model(configs: &[SignalConfig], samples: &[(usize, f64)]) -> Vec<(bool, u64)> {
        let mut last: Vec<Option<f64>> = vec![None; configs.len()];
        samples
            .iter()
            .map(|&(i, raw)| {
                let c = configs[i];
                let v = c.scaling.apply(raw);
                let ok = match last[i] {
                    None => true,
                    Some(_) if c.always => true,
                    Some(l) => c.deadband.passes(l, v),
                };
                if ok {
                    last[i] = Some(v);
                }
                (ok, v.to_bits())
            })
            .collect()
    }

    fn value() -> impl Strategy<Value = f64> {
        prop_oneof![
            4 => -1e3f64..1e3,
            1 => Just(0.0),
            1 => Just(-0.0),
            1 => Just(f64::NAN),
            1 => Just(f64::INFINITY),
            1 => Just(f64::NEG_INFINITY),
            1 => any::<f64>(),
        ]
    }

    fn config() -> impl Strategy<Value = SignalConfig> {
        (
            proptest::option::of(-10.0f64..10.0),
            proptest::option::of(-10.0f64..10.0),
            0..3u8,
            0.0f64..50.0,
            any::<bool>(),
        )
            .prop_map(|(scale, offset, kind, t, always)| SignalConfig {
                scaling: Scaling::new(scale, offset).unwrap(),
                deadband: match kind {
                    0 => Deadband::None,
                    1 => Deadband::Absolute(t),
                    _ => Deadband::Percent(t),
                },
                always,
            })
    }

    proptest! {
        #[test]
        fn batch_equals_the_plain_gate_bit_for_bit(
            configs in proptest::collection::vec(config(), 1..6),
            samples in proptest::collection::vec((0usize..6, value()), 0..200),
        ) {
            let samples: Vec<(usize, f64)> =
                samples.into_iter().map(|(i, v)| (i % configs.len(), v)).collect();
            let want = model(&configs, &samples);
            let mut b = SignalBank::new(configs.iter().copied());
            let (idx, raws): (Vec<u32>, Vec<f64>) =
                samples.iter().map(|&(i, v)| (i as u32, v)).unzip();
            let (mut p, mut s) = (Vec::new(), Vec::new());
            b.offer_batch(&idx, &raws, &mut p, &mut s).unwrap();
            let got: Vec<(bool, u64)> =
                p.iter().zip(&s).map(|(&p, v)| (p == 1, v.to_bits())).collect();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn bad_configuration_is_refused() {
        assert!(Deadband::from_config("percent", -1.0).is_err());
        assert!(Deadband::from_config("absolute", f64::NAN).is_err());
        assert!(Deadband::from_config("relative", 1.0).is_err());
        assert!(Scaling::new(Some(f64::INFINITY), None).is_err());
        assert_eq!(
            Scaling::new(None, None).unwrap().apply(-0.0).to_bits(),
            (-0.0f64).to_bits()
        );
        assert_eq!(
            Scaling::new(Some(1.0), None).unwrap().apply(-0.0).to_bits(),
            0
        );
    }
}
