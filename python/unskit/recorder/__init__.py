"""The signal-recorder: UNS signal updates into Hive-partitioned Parquet files."""
