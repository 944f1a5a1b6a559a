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

/// Hot state of one signal, 40 bytes so 1,000 signals stay in L1/L2.
#[derive(Debug, Clone, Copy)]
struct Slot {
    scale: f64,
    offset: f64,
    last: f64,
    /// The least |new - last| that publishes a finite sample, worked out when `last` is
    /// published: the absolute threshold; |last| * value / 100 for percent (0 from a last
    /// of 0: any change); 0 for none. The division then runs once per publication, not
    /// once per sample, and stays bit for bit the documented expression.
    cut: f64,
    percent: bool,
    always: bool,
    has_last: bool,
    identity: bool,
}

impl Slot {
    fn new(c: SignalConfig) -> (Self, f64) {
        let (percent, cut, param) = match c.deadband {
            Deadband::None => (false, 0.0, 0.0),
            Deadband::Absolute(t) => (false, t, t),
            Deadband::Percent(p) => (true, 0.0, p),
        };
        let slot = Slot {
            scale: c.scaling.scale,
            offset: c.scaling.offset,
            last: 0.0,
            cut,
            percent,
            always: c.always,
            has_last: false,
            identity: c.scaling.identity,
        };
        (slot, param)
    }

    /// [`Deadband::passes`] after the first-sample and `always` rules. With `cut` the
    /// finite case is one comparison for every kind: none has cut 0, so it is `value !=
    /// last`; percent from a last of 0 likewise. Decides only; `commit` publishes.
    #[inline(always)]
    fn gate(&self, raw: f64) -> (bool, f64) {
        let value = if self.identity {
            raw
        } else {
            raw * self.scale + self.offset
        };
        let last = self.last;
        let ok = if !self.has_last || self.always {
            true
        } else if !value.is_finite() || !last.is_finite() {
            value != last && !(value.is_nan() && last.is_nan())
        } else {
            (value - last).abs() >= self.cut && value != last
        };
        (ok, value)
    }

    /// Makes `value` the last published value (and works out the next percent cut).
    #[inline(always)]
    fn commit(&mut self, value: f64, params: &[f64], index: usize) {
        self.last = value;
        self.has_last = true;
        if self.percent {
            self.cut = value.abs() * params[index] / 100.0;
        }
    }

    #[inline(always)]
    fn offer(&mut self, raw: f64, params: &[f64], index: usize) -> (bool, f64) {
        let (ok, value) = self.gate(raw);
        if ok {
            self.commit(value, params, index);
        }
        (ok, value)
    }
}

/// N signals' settings and last published values: the state of the change gate.
#[derive(Debug, Clone)]
pub struct SignalBank {
    slots: Vec<Slot>,
    /// Per signal: the percentage of a percent deadband (read only when one publishes).
    params: Vec<f64>,
}

impl SignalBank {
    pub fn new(configs: impl IntoIterator<Item = SignalConfig>) -> Self {
        let (slots, params) = configs.into_iter().map(Slot::new).unzip();
        SignalBank { slots, params }
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
        Ok(slot.offer(raw, &self.params, index))
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
        if any {
            for (offset, &value) in scaled.iter().enumerate() {
                self.slots[start + offset].commit(value, &self.params, start + offset);
            }
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
        if indices.len() != raws.len() {
            return Err(CoreError::InvalidSignal(format!(
                "{} signal indices for {} values",
                indices.len(),
                raws.len()
            )));
        }
        let len = self.slots.len();
        if let Some(&bad) = indices.iter().find(|i| i.checked(len).is_none()) {
            return Err(CoreError::InvalidSignal(format!(
                "signal index {bad} out of range for a bank of {len} signals"
            )));
        }
        passed.clear();
        passed.resize(raws.len(), 0);
        scaled.clear();
        scaled.resize(raws.len(), 0.0);
        let (slots, params) = (&mut self.slots[..], &self.params[..]);
        for (((&i, &raw), p), s) in indices.iter().zip(raws).zip(passed.iter_mut()).zip(scaled) {
            // Every index was checked above; the remaining bounds check is predictable.
            let i = i.unchecked();
            let (ok, value) = slots[i].offer(raw, params, i);
            *p = ok as u8;
            *s = value;
        }
        Ok(())
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
