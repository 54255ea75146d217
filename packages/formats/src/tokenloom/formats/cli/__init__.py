"""The ``tokenloom`` command group and the validate, inspect and convert commands (never imported by a reader)."""
