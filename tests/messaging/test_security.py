"""Broker security: TLS keyed on caPath, mutual TLS, passwords only in plaintext; fail closed."""

from __future__ import annotations

from tests.messaging.conftest import broker_config
from tests.support.mosquitto import PASSWORD, USERNAME
from tests.support.servers import wait_until
from unskit.config.model import BrokerCredentials, MessagingConfig
from unskit.config.secrets import Secret
from unskit.messaging import MessagingClient


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


def test_wrong_password_is_refused(broker, make_client):
    creds = BrokerCredentials(username=USERNAME, password=Secret("wrong"))
    client = make_client(broker_config(broker.password_port, credentials=creds), wait=False)
    assert never_connects(client)


def test_server_only_tls_with_ca_path(broker, make_client, pki):
    creds = BrokerCredentials(ca_path=str(pki.ca))
    assert make_client(broker_config(broker.tls_port, credentials=creds)).connected()


def test_mutual_tls_with_ca_cert_and_key(broker, make_client, pki):
    creds = BrokerCredentials(
        ca_path=str(pki.ca), cert_path=str(pki.client_cert), key_path=str(pki.client_key)
    )
    assert make_client(broker_config(broker.mtls_port, credentials=creds)).connected()


def test_mutual_tls_listener_refuses_a_client_without_certificate(broker, make_client, pki):
    creds = BrokerCredentials(ca_path=str(pki.ca))
    client = make_client(broker_config(broker.mtls_port, credentials=creds), wait=False)
    assert never_connects(client)


def test_untrusted_broker_certificate_fails_closed(broker, make_client, pki):
    creds = BrokerCredentials(ca_path=str(pki.other_ca))
    client = make_client(broker_config(broker.tls_port, credentials=creds), wait=False)
    assert never_connects(client)


def test_cert_and_key_without_ca_path_stay_plaintext(broker, make_client, pki):
    creds = BrokerCredentials(cert_path=str(pki.client_cert), key_path=str(pki.client_key))
    # The plaintext listener accepts it; a TLS handshake there would have failed.
    assert make_client(broker_config(broker.plain_port, credentials=creds)).connected()


def test_password_is_ignored_with_ca_path(broker, make_client, pki):
    creds = BrokerCredentials(ca_path=str(pki.ca), username="nobody", password=Secret("x"))
    # The TLS listener allows anonymous clients; sending the bad user would be refused.
    assert make_client(broker_config(broker.tls_port, credentials=creds)).connected()


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
