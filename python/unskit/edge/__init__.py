"""The edge runtime's IPC bus (AWS IoT Greengrass v2): the only awsiotsdk import.

`connection` opens the component's connection to the nucleus from the variables the runtime
hands it and turns the SDK's errors into unskit's; the messaging transport, the runtime
configuration sources and the lifecycle report all go through it.
"""

from unskit.edge.connection import (
    SOCKET_ENV,
    TOKEN_ENV,
    IpcConnection,
    IpcEndpoint,
    edge_error,
)

__all__ = ["SOCKET_ENV", "TOKEN_ENV", "IpcConnection", "IpcEndpoint", "edge_error"]
