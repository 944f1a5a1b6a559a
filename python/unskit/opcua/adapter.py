"""The OPC UA driver: a `PushDriver` over asyncua, joined here from its layers: `session`
(the loop thread, the session, read and browse primitives), `subscriptions` (monitored
items and data changes) and `verbs` (reads, writes, browsing). Only these drive an asyncua
client; `variants` maps values, `matchers` decides which nodes a subscription takes.

asyncua runs on an event loop in a daemon thread the driver owns; every driver method
hands a coroutine to that loop and waits for it with a deadline. Notifications arrive on
the loop thread: one publish response becomes one `ReadingSink.deliver` batch.

Per-node recovery: a monitored item that cannot be created, or whose node disappears
(a BadNodeIdUnknown notification, a vanished node at a re-match, or asyncua's
subscription-wide StatusChange for a deleted node, after which the items are checked with
one Read), is reported as a BAD reading carrying the status name and retried from
`maintain()` after 5 s, doubling to 60 s. A model change event re-runs the matching.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from unskit.opcua.subscriptions import _Subscriptions
from unskit.opcua.verbs import _Verbs
from unskit.pki.certificates import CertificateSummary

__all__ = ["OpcUaDriver"]


class OpcUaDriver(_Verbs, _Subscriptions):
    """A `PushDriver` for one OPC UA server."""

    def describe(self) -> Mapping[str, Any]:
        facts = self._security.facts()
        server = self._security.server_certificate
        with self._lock:
            subscriptions = [
                {
                    "id": sub.spec.id,
                    "publishIntervalMs": sub.publish_ms,
                    "items": sum(1 for i in self._items.values() if i.subscription == sub.spec.id),
                    "failedItems": sum(
                        1
                        for i in self._items.values()
                        if i.subscription == sub.spec.id and i.monitored is None
                    ),
                }
                for sub in self._subscriptions.values()
            ]
        return {
            "adapter": "opcua",
            "endpoint": self.settings.connection.endpoint,
            "securityPolicy": facts["securityPolicy"],
            "messageMode": facts["messageMode"],
            "serverCertificate": CertificateSummary.of(server).to_json() if server else None,
            "subscriptions": subscriptions,
            "namespaces": {str(index): uri for index, uri in enumerate(self._namespaces)},
            "security": facts,
        }
