"""What the `blobstore` backend decides without a server: configuration rules with their
JSON path, the missing extra refused with its pip command, block ids, redacted errors."""

from __future__ import annotations

from typing import Any

from unskit.egress.verify import Algorithm


def test_configuration_rules_name_the_field(monkeypatch, tmp_path):
    from unskit.egress import backends, config

    def issues(destination: dict[str, Any]) -> list[tuple[str, str]]:
        return [
            (i.path, i.message)
            for i in config._rules(
                {
                    "instances": [
                        {
                            "id": "i",
                            "source": {"path": str(tmp_path / "src")},
                            "egress": [destination],
                        }
                    ]
                }
            )
        ]

    base = {"type": "blobstore", "account": "acct", "container": "box"}
    assert issues(base) == []
    both = issues({**base, "accountKey": "k", "connectionString": "AccountKey=k"})
    assert both == [
        (
            "$.component.instances[0].egress[0].connectionString",
            "give one of accountKey, connectionString, credentials (already accountKey)",
        )
    ]
    assert issues({**base, "connectionString": "AccountName=acct"}) == [
        ("$.component.instances[0].egress[0].connectionString", "holds no AccountKey=...")
    ]
    # Without its SDK the backend is refused at startup with the command that installs it.
    monkeypatch.setitem(backends.EXTRAS, "blobstore", ("blobstore", "azure.not_installed_x"))
    missing = issues(base)
    assert missing == [
        (
            "$.component.instances[0].egress[0].type",
            "backend 'blobstore' needs the 'azure.not_installed_x' package, which is not "
            "installed: pip install 'unskit[blobstore]'",
        )
    ]


def test_block_ids_are_deterministic_and_of_one_length():
    from unskit.egress.backends.blobstore import block_id, block_tag

    tag = block_tag(100, 5, 4096, Algorithm.CRC32C)
    assert tag == block_tag(100, 5, 4096, Algorithm.CRC32C)
    assert tag != block_tag(100, 6, 4096, Algorithm.CRC32C)
    assert tag != block_tag(100, 5, 8192, Algorithm.CRC32C)
    assert tag != block_tag(100, 5, 4096, Algorithm.SHA256)
    ids = [block_id(tag, n) for n in (1, 2, 50_000)]
    assert len(set(ids)) == 3
    assert len({len(i) for i in ids}) == 1


def test_a_connection_error_never_quotes_a_sas_signature():
    from azure.core.exceptions import ServiceRequestError

    from unskit.egress.backends.blobstore import _error

    error = _error(
        "put",
        "blob a/c/x.bin",
        ServiceRequestError(
            "HTTPConnectionPool(host='127.0.0.1', port=9): Max retries exceeded with url: "
            "/a/c/x.bin?sv=2020-10-02&sig=c2VjcmV0%3D&comp=block (Caused by refused)"
        ),
    )
    assert "sig=" not in str(error)
    assert str(error).startswith("put blob a/c/x.bin: ServiceRequestError: HTTPConnectionPool")
    assert "/a/c/x.bin?... (Caused by refused)" in str(error)
