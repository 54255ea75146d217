"""Flat shard directories: 1-D ``.npy`` or raw ``.bin`` token files (KempnerForge, tatm)."""
