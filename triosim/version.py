"""The package version (one place; the JSON result and --config blocks record it)."""

__version__ = "0.1.0"
