"""The southbound adapter runtime shared by the CIP and OPC UA adapters."""
