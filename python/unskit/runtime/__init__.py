"""The component runtime: health probes, logging, shutdown, metrics, events, the builder."""
