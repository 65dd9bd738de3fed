"""Fixtures shared by the test packages (the broker fixtures come from epochline's pytest plugin)."""

pytest_plugins = ["tests.helpers.kafka_io"]
