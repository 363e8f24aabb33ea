"""runlease: a durable run queue for long-running AI agent runs, on PostgreSQL."""

__version__ = "0.1.0"
