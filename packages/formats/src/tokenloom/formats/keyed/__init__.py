"""Keyed stores: HDF5 (``.h5``), ``<key>.bin`` + ``meta.json``, and grouped records."""
