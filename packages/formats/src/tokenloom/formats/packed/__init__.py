"""Modalities packed files (``.pbin``), with the allow-list pickle parser for their index."""
