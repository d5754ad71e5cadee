"""EAGLE-3 speculative decoding: engine-agnostic core (plain torch) and engine integrations."""

__version__ = "0.1.0"
