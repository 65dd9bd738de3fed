"""Sinks: transactional Kafka producers, the commit point of every checkpoint epoch."""
