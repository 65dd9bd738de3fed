"""Kafka source connectors: partitions into Arrow record batches, positions as SourceCheckpoints."""
