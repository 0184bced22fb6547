"""Experiments: each folder keeps its code, configs, README and results together (verl's ``recipe/``,
OpenRLHF's ``examples/``). The library and its tests import nothing from here (tests/test_layers.py)."""
