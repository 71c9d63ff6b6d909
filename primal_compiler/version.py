"""The package version (one place: the package, the program files and the reports read it)."""

__version__ = "0.1.0"
