"""What `unskit demo` runs: one configuration document per component, all under one output
folder, wired so the file egress ships what the camera adapter captures.

Layout of the output folder::

    config/     the generated configuration of each component (run them yourself)
    logs/       each component's log
    state/      command and catalog databases (commands.stateDir)
    images/     the camera adapter's output root; the egress watches it
    signals/    the signal-recorder's Parquet files of the PLC's signals; the egress watches it
    delivered/  the egress destination (images, and the Parquet files under signals/)
    archive/    sources the egress delivered and verified (kept, not deleted)

The demo needs the `embedded` extra (amqtt, unless --broker names a broker) and `opcua`
(asyncua); the signal-recorder runs when its extra (pyarrow) is installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unskit.errors import extra_installed

__all__ = [
    "CAMERAS",
    "EGRESS_INSTANCE",
    "NEEDED_EXTRAS",
    "OPCUA_INSTANCE",
    "PLC",
    "PUSH_INSTANCE",
    "ROOT",
    "SIGNALS_INSTANCE",
    "THING",
    "Peer",
    "demo_documents",
    "demo_peers",
    "missing_extras",
    "recorder_available",
]

#: The thing name (device level) every demo component runs as, and the UNS root.
THING = "gw-01"
ROOT = "uns"
#: The sim PLC instance and the sim cameras.
PLC = "press-1"
CAMERAS = ("cam-top", "cam-side")
#: The egress instance that ships the camera's images.
EGRESS_INSTANCE = "camera-images"
#: The egress instance that ships the signal-recorder's Parquet files.
SIGNALS_INSTANCE = "signal-history"
#: The OPC UA adapter's instance on the demo's OPC UA server (`unskit opcua-sim`).
OPCUA_INSTANCE = "line-1"
#: The CIP adapter's push instance on the demo's class-1 target (`unskit cip-target-sim`).
PUSH_INSTANCE = "press-io"


@dataclass(frozen=True)
class Peer:
    """A device the demo runs beside the components: an `unskit` command serving on a port."""

    name: str
    argv: tuple[str, ...]
    port: int


def demo_peers(opcua_port: int, cip_port: int) -> list[Peer]:
    """The devices, started before the components and stopped after them."""
    # The target's UDP port is any free one: it names it in its Forward Open reply.
    cip_target = (
        "cip-target-sim", "--tcp-port", str(cip_port), "--udp-port", "0", "--pattern", "demo"
    )  # fmt: skip
    return [
        Peer("opcua-sim", ("opcua-sim", "--port", str(opcua_port)), opcua_port),
        Peer("cip-target-sim", cip_target, cip_port),
    ]


def _common(output: Path, area: str) -> dict[str, Any]:
    return {
        "hierarchy": {"levels": ["site", "area", "device"]},
        "identity": {"site": "plant-1", "area": area},
        "topic": {"root": ROOT},
        # The supervisor writes the broker it runs on into each file it generates.
        "messaging": {"local": {"host": "127.0.0.1", "port": 1883}},
        "commands": {"stateDir": str(output / "state")},
        "heartbeat": {"intervalSeconds": 10},
        # On the bus, as a fleet would collect them (`make soak` reads the queue depths).
        "metricEmission": {"target": "messaging", "intervalSeconds": 10},
        "logging": {"level": "INFO"},
    }


def _plc(output: Path, cip_port: int) -> dict[str, Any]:
    def signal(name: str, tag: str, kind: str, **extra: Any) -> dict[str, Any]:
        return {"name": name, "tagPath": tag, "type": kind, **extra}

    return {
        **_common(output, "stamping"),
        "component": {
            "global": {
                "defaults": {"pollIntervalMs": 1000, "publishMode": "onChange"},
                # Target and adapter share this host: the adapter takes any free UDP port
                # and names it in its Forward Open.
                "implicitIo": {"udpPort": 0},
            },
            "instances": [
                {
                    "id": PLC,
                    "adapter": "sim",
                    "connection": {"endpoint": "sim.local"},
                    "pollGroups": [
                        {
                            "id": "fast",
                            "signals": [
                                # A sine: a 2-unit deadband keeps the view readable.
                                signal(
                                    "spindle-speed",
                                    "Program:Main.SpindleSpeed",
                                    "REAL",
                                    deadband={"type": "absolute", "value": 2},
                                ),
                                signal("running", "Program:Main.Running", "BOOL"),
                            ],
                        },
                        {
                            "id": "slow",
                            "pollIntervalMs": 2000,
                            "signals": [signal("part-count", "PartCount", "UDINT")],
                        },
                    ],
                },
                {
                    "id": PUSH_INSTANCE,
                    "mode": "push",
                    "connection": {"endpoint": f"127.0.0.1:{cip_port}"},
                    # The target animates its input assembly (`--pattern demo`): a tick
                    # count every 100 ms, a sine and toggling bits.
                    "defaults": {"batchMs": 2000},
                    "io": {
                        "rpiMs": 50,
                        "assemblies": {"input": 100, "output": 150, "config": 151},
                        "input": {
                            "sizeBytes": 16,
                            "sampleMs": 500,
                            "signals": [
                                {"name": "stroke-count", "offset": 0, "type": "UDINT"},
                                {
                                    "name": "ram-force",
                                    "offset": 4,
                                    "type": "REAL",
                                    "deadband": {"type": "absolute", "value": 5.0},
                                },
                                {"name": "guard-closed", "offset": 8, "type": "BOOL", "bit": 4},
                            ],
                        },
                        "output": {
                            "sizeBytes": 16,
                            "signals": [{"name": "force-setpoint", "offset": 0, "type": "REAL"}],
                        },
                    },
                    "writes": {"allow": ["a150/0/REAL", "a150/run"]},
                },
            ],
        },
    }


def _opcua(output: Path, opcua_port: int) -> dict[str, Any]:
    return {
        **_common(output, "assembly"),
        "component": {
            "global": {"defaults": {"publishIntervalMs": 1000}},
            "instances": [
                {
                    "id": OPCUA_INSTANCE,
                    "connection": {"endpoint": f"opc.tcp://127.0.0.1:{opcua_port}/unskit/"},
                    "subscriptions": [
                        {
                            "id": "line",
                            "include": [
                                {
                                    "namespaceUri": "urn:unskit:sim",
                                    "match": "Temperature|Counter",
                                    # Temperature moves every 100 ms: 0.1 degrees is a change.
                                    "deadband": {"type": "Absolute", "value": 0.1},
                                }
                            ],
                        }
                    ],
                    # One update per node every 2 s, each carrying the samples of the window.
                    "publish": {"batchMs": 2000},
                }
            ],
        },
    }


def _cameras(output: Path) -> dict[str, Any]:
    top, side = CAMERAS
    return {
        **_common(output, "inspection"),
        "component": {
            "cameras": [
                {
                    "instance": top,
                    "backend": "sim",
                    "connection": {"width": 640, "height": 480, "latencyMs": 20},
                    "schedules": [{"id": "every-4s", "intervalMs": 4000}],
                },
                {
                    "instance": side,
                    "backend": "sim",
                    "connection": {"width": 320, "height": 240, "pixelFormat": "mono8"},
                    "schedules": [{"id": "every-5s", "intervalMs": 5000}],
                },
            ],
            "captureProfiles": {"default": {"quality": 85}},
            # A demo folder is throwaway: no fsync, and no free-space floor to trip on.
            "storage": {
                "outputRoot": str(output / "images"),
                "fsync": False,
                "outputMinFreeBytes": 0,
                "stateMinFreeBytes": 0,
            },
        },
    }


def _egress(output: Path) -> dict[str, Any]:
    return {
        **_common(output, "inspection"),
        "component": {
            "global": {"retry": {"initialBackoffMs": 500, "maxBackoffMs": 5000}},
            "instances": [
                {
                    "id": EGRESS_INSTANCE,
                    "source": {
                        "path": str(output / "images"),
                        # Images and their JSON sidecars; the camera writes both under
                        # temporary names in .partial/ and renames them into place, so
                        # .partial is excluded and a short settle time is enough.
                        "include": ["*.jpg", "*.json"],
                        "exclude": [".partial/*"],
                        "recursive": True,
                        "settleSeconds": 0.5,
                    },
                    "onComplete": {"action": "archive", "archiveDir": str(output / "archive")},
                    "egress": [{"id": "local", "type": "local", "path": str(output / "delivered")}],
                },
                {
                    "id": SIGNALS_INSTANCE,
                    "source": {
                        "path": str(output / "signals"),
                        # The recorder writes hidden .tmp files and renames each into place
                        # once it is a complete Parquet file: only those are taken.
                        "include": ["*.parquet"],
                        "recursive": True,
                        "settleSeconds": 0.5,
                    },
                    "onComplete": {
                        "action": "archive",
                        "archiveDir": str(output / "archive" / "signals"),
                    },
                    "egress": [
                        {
                            "id": "local",
                            "type": "local",
                            "path": str(output / "delivered" / "signals"),
                        }
                    ],
                },
            ],
        },
    }


#: What the demo runs that the base install lacks: (module, extra, what needs it).
NEEDED_EXTRAS = (
    ("amqtt", "embedded", "the embedded MQTT broker"),
    ("asyncua", "opcua", "the OPC UA server and adapter"),
)


def missing_extras(*, embedded_broker: bool = True) -> str | None:
    """The refusal naming the pip command of every extra the demo needs and this environment
    lacks (the broker's only when it is embedded), or None when nothing is missing."""
    missing = [
        (module, extra, what)
        for module, extra, what in NEEDED_EXTRAS
        if (embedded_broker or extra != "embedded") and not extra_installed(module)
    ]
    if not missing:
        return None
    packages = ", ".join(f"{module!r} ({what})" for module, _, what in missing)
    extras = ",".join(extra for _, extra, _ in missing)
    return f"needs {packages}, not installed: pip install 'unskit[{extras}]'"


def recorder_available() -> bool:
    """Whether the signal-recorder can run here (its extra, pyarrow, is installed)."""
    return extra_installed("pyarrow")


def _recorder(output: Path) -> dict[str, Any]:
    return {
        **_common(output, "stamping"),
        "component": {
            # The sim PLC's signals, polled and pushed (both instances of the CIP adapter).
            "topics": {"include": [f"{ROOT}/{THING}/ethernet-ip-adapter/+/data/#"]},
            "output": {"path": str(output / "signals"), "fsync": False},
            # Short files, so the egress ships some while the demo runs.
            "roll": {"maxSeconds": 10},
        },
    }


def demo_documents(
    output: Path, opcua_port: int, cip_port: int
) -> list[tuple[str, dict[str, Any]]]:
    """(component name, configuration) of each demo process, in start order, under `output`."""
    # The egress first, so it watches the image folder before the first capture lands; the
    # recorder before the PLC, so it records the first updates.
    recorder = [("signal-recorder", _recorder(output))] if recorder_available() else []
    return [
        ("file-egress", _egress(output)),
        *recorder,
        ("ethernet-ip-adapter", _plc(output, cip_port)),
        ("opcua-adapter", _opcua(output, opcua_port)),
        ("camera-adapter", _cameras(output)),
    ]
