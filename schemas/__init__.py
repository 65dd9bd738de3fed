"""Wire formats (JSON, Avro, Confluent Avro, raw) and their mapping to and from Apache Arrow."""
