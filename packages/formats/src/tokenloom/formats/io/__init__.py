"""Plumbing shared by the formats and sibling packages: atomic writes, locks, path safety, storage errors."""
