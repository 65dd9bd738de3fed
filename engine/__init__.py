"""epochline's engine: coordinator, checkpoints, operators, batch store, local broker and CLI."""
