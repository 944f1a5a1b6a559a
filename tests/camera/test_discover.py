"""sb/discover and sb/list's unconfigured cameras: a WS-Discovery pass over unicast UDP to
ONVIF test devices on loopback, the credential-free GetDeviceInformation, the retained pass
paged without a new probe, the bounds of the body, and one pass at a time."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.camera.conftest import CameraHarness, Rig, sim
from tests.support.onvif_device import (
    PASSWORD,
    USER,
    DiscoveryResponders,
    OnvifDevice,
    probe_matches,
)
from tests.support.servers import wait_until


@pytest.fixture
def devices() -> Iterator[list[OnvifDevice]]:
    running = [
        OnvifDevice(vendor="acme", model="dome-1"),
        # Refuses GetDeviceInformation without credentials: identified from its scopes.
        OnvifDevice(vendor="closed-co", model="box-2", ptz=False, anonymous_info=False),
    ]
    yield running
    for device in running:
        device.close()


def component(devices: list[OnvifDevice], report: bool = True, **discovery: Any) -> dict[str, Any]:
    configured = {
        "instance": "known",
        "backend": "onvif",
        "connection": {"uri": devices[0].uri, "username": USER, "password": PASSWORD},
    }
    return {
        "cameras": [configured, sim("sim1")],
        "discovery": {
            "enabled": True,
            "reportUnconfigured": report,
            "multicast": False,
            "probeAddresses": [device.probe_address for device in devices],
            **discovery,
        },
    }


def by_vendor(candidates: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {candidate["vendor"]: candidate for candidate in candidates}


def test_discover_pages_the_retained_pass_and_lists_unconfigured(
    harness: CameraHarness, devices: list[OnvifDevice]
) -> None:
    rig = harness.start(component(devices))
    verbs = {v["verb"]: v for v in rig.call("describe")["verbs"]}
    assert verbs["sb/discover"]["enabled"] is True
    # Before any pass, sb/list has nothing discovered to report (it never probes itself).
    assert rig.call("list", {"includeUnconfigured": True})["unconfigured"] == []

    first = rig.call("discover", {"limit": 1, "timeoutMs": 5000})
    assert len(first["candidates"]) == 1
    assert first["nextCursor"]
    assert first["completedAt"].endswith("Z")
    probes = [device.responder.probes for device in devices]
    assert probes == [1, 1]
    rest = rig.call("discover", {"cursor": first["nextCursor"], "limit": 5})
    assert rest["nextCursor"] is None
    assert rest["completedAt"] == first["completedAt"]
    # The continuation came from the retained pass: no device was probed again.
    assert [device.responder.probes for device in devices] == probes

    found = by_vendor(first["candidates"] + rest["candidates"])
    assert set(found) == {"acme", "closed-co"}
    acme = found["acme"]
    assert acme["backend"] == "onvif"
    assert acme["model"] == "dome-1"
    assert acme["selector"] == {"uri": devices[0].uri, "endpoint": devices[0].endpoint}
    assert acme["capabilities"]["ptz"] is True
    assert acme["capabilities"]["warnings"] == []
    closed = found["closed-co"]
    # From the scopes (hardware, name), with the refusal as a warning; no credential sent.
    assert closed["model"] == "box-2"
    assert closed["capabilities"]["ptz"] is False
    assert any("refused the credentials" in w for w in closed["capabilities"]["warnings"])
    assert devices[1].refused >= 1
    assert all(device.invalid == [] and device.errors == [] for device in devices)

    listed = rig.call("list", {"includeUnconfigured": True})
    assert [entry["vendor"] for entry in listed["unconfigured"]] == ["closed-co"]
    assert set(listed["unconfigured"][0]) == {
        "backend",
        "selector",
        "vendor",
        "model",
        "capabilities",
    }
    assert rig.call("list", {})["unconfigured"] == []


def test_unconfigured_needs_report_unconfigured(
    harness: CameraHarness, devices: list[OnvifDevice]
) -> None:
    rig = harness.start(component(devices, report=False))
    assert len(rig.call("discover", {})["candidates"]) == 2
    assert rig.call("list", {"includeUnconfigured": True})["unconfigured"] == []


@pytest.mark.parametrize(
    "body",
    [
        {"backends": ["sim"]},
        {"backends": ["onvif", "onvif"]},
        {"backends": ["nope"]},
        {"timeoutMs": 99},
        {"timeoutMs": 300_001},
        {"limit": 0},
        {"limit": 1001},
        {"cursor": ""},
        {"instance": "sim1"},
        {"unknown": 1},
    ],
)
def test_discover_bad_args(
    harness: CameraHarness, devices: list[OnvifDevice], body: dict[str, Any]
) -> None:
    rig = harness.start(component(devices))
    assert rig.error("discover", body) == "BAD_ARGS"
    assert [device.responder.probes for device in devices] == [0, 0]


@pytest.mark.slow
def test_one_pass_at_a_time_and_a_silent_address_ends_with_the_timeout(
    harness: CameraHarness, devices: list[OnvifDevice]
) -> None:
    # A responder that never answers (an open port that drops every probe) keeps the pass
    # listening until its bound; meanwhile another request is refused, not queued.
    mute = DiscoveryResponders(devices, count=1)
    mute.close()  # its port is closed again: nothing answers there
    rig = harness.start(
        component(devices, probeAddresses=[devices[0].probe_address, mute.addresses[0]])
    )
    outcome: dict[str, Any] = {}

    def long_pass() -> None:
        outcome["reply"] = rig.call("discover", {"timeoutMs": 6000})

    worker = threading.Thread(target=long_pass)
    worker.start()
    try:
        # The pass has claimed its slot once its probe reached the device.
        wait_until(lambda: devices[0].responder.probes == 1, 10, "the first probe")
        assert rig.error("discover", {"timeoutMs": 100}) == "RESOURCE_LIMIT"
        # The inbox is not held by the pass: other verbs answer while it runs.
        assert rig.call("status", {}, "sim1")["instance"] == "sim1"
        assert worker.is_alive()
    finally:
        worker.join(30)
    assert [c["vendor"] for c in outcome["reply"]["candidates"]] == ["acme"]
    assert devices[0].responder.probes == 1


def test_discovery_off_is_unsupported(harness: CameraHarness, devices: list[OnvifDevice]) -> None:
    document = component(devices)
    document["discovery"]["enabled"] = False
    rig: Rig = harness.start(document)
    assert rig.error("discover", {}) == "UNSUPPORTED_CAPABILITY"


def test_discover_over_ipv6_loopback(harness: CameraHarness, devices: list[OnvifDevice]) -> None:
    responder = DiscoveryResponders([devices[0]], host="::1")
    try:
        rig = harness.start(component(devices, probeAddresses=responder.addresses))
        assert responder.addresses[0].startswith("[::1]:")
        candidates = rig.call("discover", {"timeoutMs": 5000})["candidates"]
    finally:
        responder.close()
    assert [c["selector"]["endpoint"] for c in candidates] == [devices[0].endpoint]
    assert candidates[0]["vendor"] == "acme"
    assert responder.probes == 1


def test_discover_by_multicast_on_loopback(
    harness: CameraHarness, devices: list[OnvifDevice]
) -> None:
    # The probe goes to 239.255.255.250:3702 out of the loopback interface only.
    responder = DiscoveryResponders([devices[0]], multicast=True)
    try:
        rig = harness.start(
            component(devices, multicast=True, multicastInterface="127.0.0.1", probeAddresses=[])
        )
        candidates = rig.call("discover", {"timeoutMs": 1000})["candidates"]
    finally:
        responder.close()
    # Other runs on this host may answer too: ours is the one with our endpoint.
    ours = [c for c in candidates if c["selector"]["endpoint"] == devices[0].endpoint]
    assert len(ours) == 1
    assert ours[0]["vendor"] == "acme"
    assert ours[0]["selector"]["uri"] == devices[0].uri
    assert responder.probes >= 1


LAUGHS = (
    b'<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa">'
    b'<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;"><!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">]>'
    b"<l>&c;</l>"
)


def test_malformed_and_foreign_answers_are_ignored(
    harness: CameraHarness, devices: list[OnvifDevice]
) -> None:
    # A responder that answers each probe with garbage, an entity bomb, a ProbeMatches for
    # another probe, and one with no XAddrs: the pass keeps only the real device.
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(10)
    answered = threading.Event()

    def answer() -> None:
        try:
            _, sender = sock.recvfrom(65535)
        except OSError:
            return
        other = probe_matches("urn:uuid:someone-else", devices[1])
        for datagram in (b"\x00<not xml", LAUGHS, other, b"x" * 60_000):
            sock.sendto(datagram, sender)
        answered.set()

    worker = threading.Thread(target=answer)
    worker.start()
    try:
        bad = f"127.0.0.1:{sock.getsockname()[1]}"
        rig = harness.start(component(devices, probeAddresses=[bad, devices[0].probe_address]))
        candidates = rig.call("discover", {"timeoutMs": 2000})["candidates"]
        assert answered.wait(5)
    finally:
        worker.join(15)
        sock.close()
    assert [c["vendor"] for c in candidates] == ["acme"]
