"""Random JSON bodies at every registered verb: every reply is a success body or one of the
specification's error codes, and the inbox keeps serving."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.commands.sample_component import SampleComponent
from unskit.commands import ErrorCode

CODES = {code.value for code in ErrorCode}
VERBS = [verb.name for verb in SampleComponent().verbs()] + ["describe", "reload-config"]
# Declared names show up often, so the checks past "unknown field" get exercised too.
FIELD_NAMES = st.sampled_from(
    [
        "requestId",
        "instance",
        "value",
        "label",
        "metadata",
        "durationMs",
        "fail",
        "limit",
        "cursor",
        "dryRun",
    ]
) | st.text(max_size=8)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
BODIES = st.dictionaries(FIELD_NAMES, VALUES, max_size=5)
INSTANCES = st.none() | st.sampled_from(["cam-1", "cam-2", "cam-9"])


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(verb=st.sampled_from(VERBS), body=BODIES, instance=INSTANCES)
def test_every_reply_is_a_body_or_a_specified_code(
    start_sample_once, verb: str, body: dict[str, Any], instance: str | None
) -> None:
    sample = start_sample_once
    if verb == "job":
        # Deferred jobs are held for durationMs: keep them short.
        body = {**body, "durationMs": 0} if "durationMs" in body else body
    reply = sample.client.send(verb, body, instance=instance, timeout=10).get().body
    assert isinstance(reply, dict)
    if "errorCode" in reply:
        assert reply["errorCode"] in CODES, reply
        assert reply["errorMessage"]
