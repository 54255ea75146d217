"""Catalogue rows for wave 3's correctness issue (#21): the streaming items that are an input or a fault."""

from __future__ import annotations
