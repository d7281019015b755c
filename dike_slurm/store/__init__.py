"""The engine's state store: the SQLite state, its records, the audit export, the lock file."""
