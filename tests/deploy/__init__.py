"""The production deployment of deploy/, run for real: PostgreSQL, the code server, the daemon."""
