"""`LogixSession`'s failures: each is a DeviceError and none leaves a socket open."""

from __future__ import annotations

import pytest

from unskit.cip.logix import LogixSession
from unskit.errors import DeviceError


def test_a_port_pycomm3_refuses_is_a_device_error_naming_the_path() -> None:
    with pytest.raises(DeviceError, match=r"127\.0\.0\.1:65535: .*Invalid port"):
        LogixSession("127.0.0.1:65535", routed=False)
