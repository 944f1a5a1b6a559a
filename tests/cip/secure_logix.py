"""cpppo's Logix simulator with a CIP Security object (class 0x5D) and an EtherNet/IP
Security object (class 0x5E), instance 1, holding a configured posture: the device the
posture read is tested against (cpppo itself has neither object).

Run as ``python -m tests.cip.secure_logix --address HOST:PORT Tag=TYPE ...``."""

from __future__ import annotations

import sys
from typing import Any

from cpppo.server.enip import device, parser
from cpppo.server.enip.main import main

#: IANA codes, each as two USINTs after a USINT count (the Cipher Suites attribute).
AVAILABLE = [3, 0x13, 0x01, 0x13, 0x02, 0xC0, 0x2B]
ALLOWED = [1, 0x13, 0x01]


class CipSecurityObject(device.Object):  # type: ignore[misc]
    """State configured (2); profiles EtherNet/IP Integrity and Confidentiality, the
    latter configured."""

    class_id = 0x5D

    def __init__(self, name: str | None = None, **kwds: Any) -> None:
        super().__init__(name=name, **kwds)
        if self.instance_id:
            self.attribute["1"] = device.Attribute("State", parser.USINT, default=2)
            self.attribute["2"] = device.Attribute("Profiles", parser.UINT, default=0b110)
            self.attribute["3"] = device.Attribute("Configured", parser.UINT, default=0b100)


class EnipSecurityObject(device.Object):  # type: ignore[misc]
    """Configured, three suites available and one allowed, client certificates verified,
    expiration checked, one active device certificate."""

    class_id = 0x5E

    def __init__(self, name: str | None = None, **kwds: Any) -> None:
        super().__init__(name=name, **kwds)
        if self.instance_id:
            self.attribute["1"] = device.Attribute("State", parser.USINT, default=2)
            self.attribute["3"] = device.Attribute("Available", parser.USINT, default=AVAILABLE)
            self.attribute["4"] = device.Attribute("Allowed", parser.USINT, default=ALLOWED)
            self.attribute["6"] = device.Attribute("Certificates", parser.USINT, default=[1])
            self.attribute["9"] = device.Attribute("Verify", parser.USINT, default=1)
            self.attribute["11"] = device.Attribute("Expiration", parser.USINT, default=1)


if __name__ == "__main__":
    CipSecurityObject(instance_id=1)
    EnipSecurityObject(instance_id=1)
    sys.exit(main())
