"""The signal kernels through the bindings: the gate's rule, batches, bad input, and
parity with the pure-Python twin in `unskit._reference.signal`."""

from __future__ import annotations

import array
import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unskit._reference.signal import RefBank, RefConfig
from unskit.errors import SignalError, UnskitError
from unskit.signal import GateSpec, SignalBank, scale_values

NAN, INF = math.nan, math.inf


def run(spec: GateSpec, values: list[float]) -> list[bool]:
    bank = SignalBank([spec])
    return [bank.offer(0, v)[0] for v in values]


def test_first_sample_publishes_and_none_needs_a_change():
    assert run(GateSpec(), [1, 1, 2, 2]) == [True, False, True, False]


def test_absolute_compares_with_the_last_published_value():
    spec = GateSpec(deadband="absolute", deadband_value=1.0)
    assert run(spec, [0, 0.6, 1.0, 1.9, 2.0]) == [True, False, True, False, True]


def test_percent_is_relative_to_last_published_and_any_change_from_zero():
    spec = GateSpec(deadband="percent", deadband_value=10.0)
    assert run(spec, [100, 109, 110, 0, 0, 0.001]) == [True, False, True, True, False, True]


@pytest.mark.parametrize("deadband", ["none", "absolute", "percent"])
def test_nan_and_infinities_publish_on_transitions_only(deadband):
    spec = GateSpec(deadband=deadband, deadband_value=5.0)
    got = run(spec, [NAN, NAN, 1.0, NAN, INF, INF, -INF, 1.0])
    assert got == [True, False, True, True, True, False, True, True]


def test_always_bypasses_the_deadband_after_scaling():
    bank = SignalBank([GateSpec(2.0, 1.0, "absolute", 100.0, "always")])
    assert bank.offer(0, 3) == (True, 7.0)
    assert bank.offer(0, 3) == (True, 7.0)
    assert bank.last(0) == 7.0


def test_batch_takes_numpy_arrays_lists_and_array_module_buffers():
    specs = [GateSpec(), GateSpec(scale=0.5, deadband="absolute", deadband_value=1.0)]
    idx = [0, 1, 1, 0, 1]
    raw = [1.0, 10.0, 11.0, 1.0, 12.0]
    want_mask = [True, True, False, False, True]
    want_values = [1.0, 5.0, 5.5, 1.0, 6.0]
    for i, v in [
        (idx, raw),
        (np.array(idx, dtype=np.int64), np.array(raw)),
        (np.array(idx, dtype=np.uint32), np.array(raw, dtype=np.float32)),
        (array.array("H", idx), array.array("i", [int(x) for x in raw])),
    ]:
        batch = SignalBank(specs).offer_batch(i, v)
        assert list(batch.mask) == want_mask
        assert list(batch.values) == want_values
        assert batch.passed() == [0, 1, 4]
        assert np.frombuffer(batch.values.obj, dtype=np.float64).tolist() == want_values


def test_large_batch_releases_the_gil_and_agrees_with_single_offers():
    rng = np.random.default_rng(7)
    n, signals = 50_000, 100
    idx = rng.integers(0, signals, n).astype(np.int32)
    raw = rng.normal(0, 10, n)
    specs = [GateSpec(deadband="percent", deadband_value=5.0)] * signals
    batch = SignalBank(specs).offer_batch(idx, raw)
    one = SignalBank(specs)
    assert list(batch.mask) == [
        one.offer(int(i), float(v))[0] for i, v in zip(idx, raw, strict=True)
    ]


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64, np.uint32])
def test_numpy_batches_run_in_chunks_and_equal_the_reference(index_dtype):
    rng = np.random.default_rng(11)
    n, signals = 40_000, 50  # past two chunks of 16,384 samples
    idx = rng.integers(0, signals, n).astype(index_dtype)
    raw = rng.normal(100, 3, n)
    raw[::997] = np.nan
    raw[5::1009] = np.inf
    cfgs = [
        RefConfig(
            scale=None if i % 3 == 0 else 1.5,
            offset=None if i % 4 else -2.0,
            deadband=("none", "absolute", "percent")[i % 3],
            value=[0.0, 2.0, 1.0][i % 3],
            always=i % 7 == 0,
        )
        for i in range(signals)
    ]
    specs = [
        GateSpec(c.scale, c.offset, c.deadband, c.value, "always" if c.always else "onChange")  # type: ignore[arg-type]
        for c in cfgs
    ]
    ours, ref = SignalBank(specs), RefBank(cfgs)
    batch = ours.offer_batch(idx, raw)
    want = [ref.offer(int(i), float(v)) for i, v in zip(idx, raw, strict=True)]
    assert list(batch.mask) == [ok for ok, _ in want]
    assert [bits(v) for v in batch.values] == [bits(v) for _, v in want]
    # A strided view takes the copying path and gives the same answer.
    again = SignalBank(specs).offer_batch(np.repeat(idx, 2)[::2], np.repeat(raw, 2)[::2])
    assert bytes(again.values.obj) == bytes(batch.values.obj)


def test_batch_results_are_read_only_buffers_lent_without_a_copy():
    batch = SignalBank([GateSpec()]).offer_batch(np.zeros(3, np.int32), np.arange(3.0))
    view = memoryview(batch.values.obj)
    assert view.readonly
    assert view.nbytes == 24
    assert len(batch.values.obj) == 24
    with pytest.raises(ValueError, match="WRITEABLE"):
        np.frombuffer(batch.values.obj, np.float64).setflags(write=True)


def test_a_bad_index_in_a_late_chunk_changes_nothing():
    bank = SignalBank([GateSpec(), GateSpec()])
    idx = np.zeros(50_000, np.int64)
    idx[-1] = 2
    with pytest.raises(SignalError, match="signal index 2 out of range"):
        bank.offer_batch(idx, np.ones(50_000))
    assert bank.last(0) is None


def test_a_bad_index_raises_and_changes_nothing():
    bank = SignalBank([GateSpec()])
    with pytest.raises(SignalError, match="out of range"):
        bank.offer_batch([0, 1], [1.0, 2.0])
    assert bank.last(0) is None
    with pytest.raises(SignalError, match="2 signal indices for 1 values"):
        bank.offer_batch([0, 0], [1.0])
    with pytest.raises(SignalError, match="not a signal index"):
        bank.offer_batch([-1], [1.0])
    for dtype in (np.int32, np.int64):
        with pytest.raises(SignalError, match="signal index -1 out of range"):
            bank.offer_batch(np.array([0, -1], dtype=dtype), np.array([1.0, 2.0]))
    assert bank.last(0) is None
    with pytest.raises(SignalError, match="out of range"):
        bank.offer(3, 1.0)
    with pytest.raises(SignalError, match="numeric buffer or a sequence"):
        bank.offer_batch([0], ["x"])
    with pytest.raises(SignalError, match="one-dimensional"):
        bank.offer_batch([0], np.zeros((1, 1)))


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (GateSpec(deadband="absolute", deadband_value=-1), "deadband value"),
        (GateSpec(deadband="relative"), "deadband type"),  # type: ignore[arg-type]
        (GateSpec(scale=INF), "scale must be a finite"),
        (GateSpec(offset=NAN), "offset must be a finite"),
    ],
)
def test_bad_settings_are_signal_errors(spec, match):
    with pytest.raises(SignalError, match=match) as info:
        SignalBank([spec])
    assert isinstance(info.value, UnskitError)
    assert isinstance(info.value, ValueError)


def test_reset_forgets_the_last_published_value():
    bank = SignalBank([GateSpec(), GateSpec()])
    bank.offer_batch([0, 1], [1, 1])
    bank.reset(0)
    assert bank.offer(0, 1) == (True, 1.0)
    assert bank.offer(1, 1) == (False, 1.0)
    bank.reset()
    assert bank.offer(1, 1) == (True, 1.0)


def test_scale_values_is_element_wise_and_identity_keeps_negative_zero():
    assert scale_values([1, 2, 3], 2.0, 0.5) == [2.5, 4.5, 6.5]
    assert math.copysign(1, scale_values([-0.0])[0]) == -1


# ---------------------------------------------------------------------------------------
# Parity with the reference twin.

floats = st.floats(allow_nan=True, allow_infinity=True, width=64)
finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6)
configs = st.builds(
    RefConfig,
    scale=st.none() | finite,
    offset=st.none() | finite,
    deadband=st.sampled_from(["none", "absolute", "percent"]),
    value=st.floats(min_value=0, max_value=200, allow_nan=False),
    always=st.booleans(),
)


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


@settings(max_examples=300, deadline=None)
@given(
    cfgs=st.lists(configs, min_size=1, max_size=6),
    data=st.data(),
)
def test_batches_agree_with_the_reference_bit_for_bit(cfgs, data):
    n = len(cfgs)
    samples = data.draw(
        st.lists(
            st.tuples(
                st.integers(0, n - 1),
                floats | st.sampled_from([0.0, -0.0, 1.0, 100.0]) | st.integers(-5, 5),
            ),
            max_size=60,
        )
    )
    specs = [
        GateSpec(
            c.scale,
            c.offset,
            c.deadband,  # type: ignore[arg-type]
            c.value,
            "always" if c.always else "onChange",
        )
        for c in cfgs
    ]
    ours = SignalBank(specs)
    ref = RefBank(cfgs)
    batch = ours.offer_batch([i for i, _ in samples], [float(v) for _, v in samples])
    for k, (i, v) in enumerate(samples):
        ok, value = ref.offer(i, v)
        assert batch.mask[k] == ok, (k, i, v)
        assert bits(batch.values[k]) == bits(value), (k, i, v)
    for i in range(n):
        last = ours.last(i)
        assert (last is None) == (ref.last[i] is None)
        if last is not None:
            assert bits(last) == bits(ref.last[i])  # type: ignore[arg-type]
