"""Component configuration: sources and platforms, schemas, `$secret` references, reload."""
