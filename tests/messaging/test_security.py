"""Broker security: TLS keyed on caPath, mutual TLS, passwords only in plaintext; fail closed."""

from __future__ import annotations

import logging
import ssl
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as paho
import pytest

from tests.messaging.conftest import broker_config
from tests.support.mosquitto import PASSWORD, USERNAME, Mosquitto
from tests.support.pki import Pki
from tests.support.servers import wait_until
from unskit.config.model import BrokerCredentials, MessagingConfig
from unskit.config.secrets import Secret
from unskit.messaging import MessagingClient

REFUSED = "broker refused the connection"


class PasswordTlsMosquitto(Mosquitto):
    """The shared broker's listeners, but the TLS listener refuses anonymous clients and
    checks the password file instead."""

    def write_config(self) -> Path:
        config = super().write_config()
        text = config.read_text()
        anonymous = f"listener {self.tls_port} 127.0.0.1\nallow_anonymous true\n"
        assert anonymous in text, "the TLS listener's block changed"
        password = f"allow_anonymous false\npassword_file {self.folder / 'passwd'}\n"
        config.write_text(
            text.replace(anonymous, f"listener {self.tls_port} 127.0.0.1\n{password}")
        )
        return config


@pytest.fixture(scope="module")
def password_tls_broker(
    tmp_path_factory: pytest.TempPathFactory, pki: Pki
) -> Iterator[PasswordTlsMosquitto]:
    mosquitto = PasswordTlsMosquitto(tmp_path_factory.mktemp("mosquitto-tls-password"), pki)
    mosquitto.start()
    yield mosquitto
    mosquitto.stop()


def paho_connects(port: int, ca: Path, username: str, password: str) -> bool:
    """Whether plain paho, sending this user and password over TLS, gets a CONNACK success."""
    outcome: list[bool] = []
    done = threading.Event()

    def on_connect(_c: paho.Client, _u: object, _f: object, reason: paho.ReasonCode, _p: object):
        outcome.append(not reason.is_failure)
        done.set()

    client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"ctl-{uuid.uuid4().hex}")
    client.tls_set_context(ssl.create_default_context(cafile=str(ca)))
    client.username_pw_set(username, password)
    client.on_connect = on_connect
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        assert done.wait(10), "no CONNACK from the broker"
        return outcome[0]
    finally:
        client.disconnect()
        client.loop_stop()


def never_connects(client: MessagingClient, within: float = 2.0) -> bool:
    """True when the link stays down for `within` s of polling."""
    try:
        wait_until(client.connected, within, "a connection that must not happen")
    except AssertionError:
        return True
    return False


def test_username_and_password_on_a_plaintext_local_broker(broker, make_client):
    creds = BrokerCredentials(username=USERNAME, password=Secret(PASSWORD))
    client = make_client(broker_config(broker.password_port, credentials=creds))
    assert client.connected()


def test_wrong_password_is_refused(broker, make_client, caplog):
    caplog.set_level(logging.WARNING, logger="unskit.messaging.mqtt")
    creds = BrokerCredentials(username=USERNAME, password=Secret("wrong"))
    client = make_client(broker_config(broker.password_port, credentials=creds), wait=False)
    wait_until(lambda: REFUSED in caplog.text, 10, "the broker's refusal to be reported")
    assert not client.connected()
    assert "wrong" not in caplog.text, "the password is never logged"


def test_server_only_tls_with_ca_path(broker, make_client, pki):
    creds = BrokerCredentials(ca_path=str(pki.ca))
    assert make_client(broker_config(broker.tls_port, credentials=creds)).connected()


def test_mutual_tls_with_ca_cert_and_key(broker, make_client, pki):
    # Control: the listener refuses a client that presents no certificate, so the connection
    # below proves ours was presented.
    without = BrokerCredentials(ca_path=str(pki.ca))
    assert never_connects(
        make_client(broker_config(broker.mtls_port, credentials=without), wait=False)
    )
    creds = BrokerCredentials(
        ca_path=str(pki.ca), cert_path=str(pki.client_cert), key_path=str(pki.client_key)
    )
    assert make_client(broker_config(broker.mtls_port, credentials=creds)).connected()


def test_untrusted_broker_certificate_fails_closed(broker, make_client, pki):
    creds = BrokerCredentials(ca_path=str(pki.other_ca))
    client = make_client(broker_config(broker.tls_port, credentials=creds), wait=False)
    assert never_connects(client)


def test_cert_and_key_without_ca_path_stay_plaintext(broker, make_client, pki):
    creds = BrokerCredentials(cert_path=str(pki.client_cert), key_path=str(pki.client_key))
    # The plaintext listener accepts it; a TLS handshake there would have failed.
    assert make_client(broker_config(broker.plain_port, credentials=creds)).connected()


def test_password_is_ignored_with_ca_path(password_tls_broker, make_client, pki, caplog):
    port = password_tls_broker.tls_port
    # Control: this TLS listener admits exactly this user with this password.
    assert paho_connects(port, pki.ca, USERNAME, PASSWORD)
    assert not paho_connects(port, pki.ca, USERNAME, "wrong")
    caplog.set_level(logging.WARNING, logger="unskit.messaging.mqtt")
    creds = BrokerCredentials(ca_path=str(pki.ca), username=USERNAME, password=Secret(PASSWORD))
    client = make_client(broker_config(port, credentials=creds), wait=False)
    # Spec 1: with caPath the username and password are not sent, so the broker, which
    # completed the TLS handshake, refuses an anonymous client.
    wait_until(lambda: REFUSED in caplog.text, 10, "the broker's refusal of an anonymous client")
    assert not client.connected()


@pytest.mark.parametrize(
    ("link", "fields", "warning"),
    [
        (
            "northbound",
            {"username": USERNAME, "password": Secret(PASSWORD)},
            "messaging.northbound.credentials: username and password are not sent: they go "
            "only to a plaintext local broker",
        ),
        (
            "local",
            {"ca": True, "username": USERNAME, "password": Secret(PASSWORD)},
            "messaging.local.credentials: username and password are not sent with caPath (TLS)",
        ),
        (
            "local",
            {"cert": True},
            "messaging.local.credentials: certPath and keyPath are not used without caPath "
            "(plaintext)",
        ),
    ],
    ids=["northbound-login", "local-login-with-tls", "local-cert-without-tls"],
)
def test_credentials_spec_1_ignores_are_logged_when_the_link_starts(
    broker, make_client, pki, caplog, link, fields, warning
):
    # Issue 36: a northbound username was dropped without a word (the broker then refused
    # "not authorised"); validation refuses it now, and a BrokerConfig built in code says so.
    caplog.set_level(logging.WARNING, logger="unskit.messaging.mqtt")
    creds = BrokerCredentials(
        ca_path=str(pki.ca) if fields.get("ca") else None,
        cert_path=str(pki.client_cert) if fields.get("cert") else None,
        key_path=str(pki.client_key) if fields.get("cert") else None,
        username=fields.get("username"),
        password=fields.get("password"),
    )
    port = broker.tls_port if fields.get("ca") else broker.plain_port
    configured = broker_config(port, credentials=creds)
    if link == "northbound":
        client = make_client(broker_config(broker.plain_port), northbound=configured)
        wait_until(client.northbound_connected, 10, "the northbound link")
    else:
        make_client(configured)
    assert [r.getMessage() for r in caplog.records if "credentials" in r.getMessage()] == [warning]
    assert PASSWORD not in caplog.text


def test_secret_reference_is_resolved_at_connect_time(broker, pki):
    from unskit.config.secrets import SecretRef

    resolved: list[SecretRef] = []

    class Vault:
        def resolve(self, ref: SecretRef) -> Secret:
            resolved.append(ref)
            return Secret(PASSWORD)

    ref = SecretRef.parse({"$secret": "broker-password"})
    assert ref is not None
    creds = BrokerCredentials(username=USERNAME, password=ref)
    client = MessagingClient(
        MessagingConfig(local=broker_config(broker.password_port, credentials=creds)),
        secrets=Vault(),
    )
    assert resolved == []  # nothing resolved before connecting
    try:
        client.start()
        wait_until(client.connected, 10, "connection with the resolved password")
        assert resolved == [ref]
    finally:
        client.close(2)


def test_repr_of_credentials_never_shows_the_password(broker):
    creds = BrokerCredentials(username=USERNAME, password=Secret(PASSWORD))
    assert PASSWORD not in repr(broker_config(broker.plain_port, credentials=creds))
