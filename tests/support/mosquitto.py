"""A real Mosquitto broker for tests: plain, password, TLS and mutual-TLS listeners on free
loopback ports, TCP_NODELAY on, sessions persisted across a restart."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tests.support.pki import Pki
from tests.support.servers import free_port, port_open, require_binary, wait_until

USERNAME = "edge"
PASSWORD = "s3cret"


class _BrokerProcess:
    """A mosquitto process started from a configuration file in `folder`, logging there."""

    folder: Path
    process: subprocess.Popen[bytes] | None

    @property
    def log_path(self) -> Path:
        return self.folder / "mosquitto.log"

    def _launch(self, config: Path, ports: tuple[int, ...]) -> None:
        with self.log_path.open("ab") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                [require_binary("mosquitto"), "-c", str(config)], stdout=log, stderr=log
            )
        wait_until(
            lambda: self._alive() and all(port_open(p) for p in ports),
            10,
            f"mosquitto listening on {ports} (log: {self.log_path})",
        )

    def _alive(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"mosquitto exited: {self.log_path.read_text()[-2000:]}")
        return True

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()  # SIGTERM: mosquitto saves its sessions first
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        self.process = None


@dataclass
class Mosquitto(_BrokerProcess):
    folder: Path
    pki: Pki
    plain_port: int = field(default_factory=free_port)
    password_port: int = field(default_factory=free_port)
    tls_port: int = field(default_factory=free_port)
    mtls_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def write_config(self) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        passwd = self.folder / "passwd"
        passwd.unlink(missing_ok=True)
        subprocess.run(
            [require_binary("mosquitto_passwd"), "-c", "-b", str(passwd), USERNAME, PASSWORD],
            check=True,
            capture_output=True,
        )
        passwd.chmod(0o600)
        pki = self.pki
        tls = f"cafile {pki.ca}\ncertfile {pki.server_cert}\nkeyfile {pki.server_key}\n"
        lines = [
            "per_listener_settings true",
            # As root, mosquitto would drop to a user that cannot read our 0600 keys.
            "user root" if os.geteuid() == 0 else "",
            "persistence true",
            f"persistence_location {self.folder}/",
            "log_dest stdout",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "max_queued_messages 100000",
            "set_tcp_nodelay true",
            f"listener {self.plain_port} 127.0.0.1",
            "allow_anonymous true",
            f"listener {self.password_port} 127.0.0.1",
            "allow_anonymous false",
            f"password_file {passwd}",
            f"listener {self.tls_port} 127.0.0.1",
            "allow_anonymous true",
            tls,
            f"listener {self.mtls_port} 127.0.0.1",
            "allow_anonymous false",
            tls,
            "require_certificate true",
            "use_identity_as_username true",
        ]
        config = self.folder / "mosquitto.conf"
        config.write_text("\n".join(lines) + "\n")
        return config

    def start(self) -> Mosquitto:
        config = self.write_config()
        self._launch(config, (self.plain_port, self.password_port, self.tls_port, self.mtls_port))
        return self

    def kill(self) -> None:
        """SIGKILL: sessions and queued messages not yet saved are lost."""
        if self.process is None:
            return
        self.process.kill()
        self.process.wait(5)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


# Where Debian's mosquitto package puts the dynamic-security plugin.
DYNSEC_PLUGIN = Path("/usr/lib/x86_64-linux-gnu/mosquitto_dynamic_security.so")
DYNSEC_ADMIN = "admin"
DYNSEC_ADMIN_PASSWORD = "adm1n-s3cret"
DYNSEC_TOPIC = "$CONTROL/dynamic-security/v1"


@dataclass
class DynsecMosquitto(_BrokerProcess):
    """A Mosquitto broker whose access control is the dynamic-security plugin, changed live
    over its control topic. Unlike `acl_file` (Mosquitto 2.0 checks that only on delivery and
    grants every SUBSCRIBE), its subscribe ACLs refuse a SUBSCRIBE in the SUBACK. Anyone
    may publish; subscribing needs a role (`allow_subscribe`) or `default_subscribe(True)`.
    A role change disconnects the client it concerns; a default-access change does not."""

    folder: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> DynsecMosquitto:
        if not DYNSEC_PLUGIN.exists():
            raise RuntimeError(f"mosquitto's dynamic-security plugin is missing: {DYNSEC_PLUGIN}")
        self.folder.mkdir(parents=True, exist_ok=True)
        state = self.folder / "dynamic-security.json"
        state.unlink(missing_ok=True)
        ctrl = require_binary("mosquitto_ctrl")
        init = [ctrl, "dynsec", "init", str(state), DYNSEC_ADMIN, DYNSEC_ADMIN_PASSWORD]
        subprocess.run(init, check=True, capture_output=True, timeout=30)
        document = json.loads(state.read_text())
        document["defaultACLAccess"] = {
            "publishClientSend": True,
            "publishClientReceive": True,
            "subscribe": False,
            "unsubscribe": True,
        }
        state.write_text(json.dumps(document))
        state.chmod(0o600)
        lines = [
            "user root" if os.geteuid() == 0 else "",
            "log_dest stdout",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "set_tcp_nodelay true",
            f"listener {self.port} 127.0.0.1",
            f"plugin {DYNSEC_PLUGIN}",
            f"plugin_opt_config_file {state}",
        ]
        config = self.folder / "mosquitto.conf"
        config.write_text("\n".join(lines) + "\n")
        self._launch(config, (self.port,))
        return self

    def control(self, *commands: dict[str, Any]) -> None:
        """Sends dynamic-security commands as the admin and waits for their responses;
        raises when the broker reports an error or does not answer in 10 s."""
        done = threading.Event()
        responses: list[dict[str, Any]] = []
        admin = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"dynsec-admin-{uuid.uuid4().hex[:8]}",
            protocol=MQTTProtocolVersion.MQTTv311,
        )
        admin.username_pw_set(DYNSEC_ADMIN, DYNSEC_ADMIN_PASSWORD)

        def on_connect(client: paho.Client, *_: Any) -> None:
            client.subscribe(f"{DYNSEC_TOPIC}/response", 1)

        def on_subscribe(client: paho.Client, *_: Any) -> None:
            client.publish(DYNSEC_TOPIC, json.dumps({"commands": list(commands)}), 1)

        def on_message(_c: paho.Client, _u: Any, message: paho.MQTTMessage) -> None:
            responses.extend(json.loads(message.payload)["responses"])
            done.set()

        admin.on_connect, admin.on_subscribe, admin.on_message = (
            on_connect,
            on_subscribe,
            on_message,
        )
        admin.connect("127.0.0.1", self.port)
        admin.loop_start()
        try:
            if not done.wait(10):
                raise RuntimeError(f"no dynamic-security response to {commands}")
        finally:
            admin.disconnect()
            admin.loop_stop()
        errors = [r for r in responses if "error" in r]
        if errors:
            raise RuntimeError(f"dynamic-security commands failed: {errors}")

    def create_client(self, username: str, password: str) -> None:
        """A client account with no role: it may publish; a SUBSCRIBE is refused by default."""
        self.control({"command": "createClient", "username": username, "password": password})

    def allow_subscribe(self, username: str, pattern: str) -> None:
        """Grants `username` subscriptions matching `pattern`, with a role of its own (the
        broker disconnects the client if it is connected)."""
        role = f"sub-{uuid.uuid4().hex[:8]}"
        self.control(
            {"command": "createRole", "rolename": role},
            {
                "command": "addRoleACL",
                "rolename": role,
                "acltype": "subscribePattern",
                "topic": pattern,
                "priority": 5,
                "allow": True,
            },
            {"command": "addClientRole", "username": username, "rolename": role},
        )

    def default_subscribe(self, allow: bool) -> None:
        """Allows or refuses, live, every SUBSCRIBE no role decides; nobody is disconnected."""
        self.control(
            {
                "command": "setDefaultACLAccess",
                "acls": [{"acltype": "subscribe", "allow": allow}],
            }
        )
