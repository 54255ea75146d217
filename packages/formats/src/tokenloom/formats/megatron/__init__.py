"""Megatron-LM indexed datasets (``MMIDIDX`` ``.idx`` + ``.bin``)."""
