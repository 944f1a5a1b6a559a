"""The opcua-adapter: OPC UA nodes subscribed through asyncua and published into the UNS."""
