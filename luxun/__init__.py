"""luxun: the broker (topic manager, QueueService, server, config, retention, metrics, CLI)."""
