"""The package's version, in a module of its own: report.py reads it without importing the package
root (which imports the whole pipeline), and pyproject.toml reads it without importing anything."""

__version__ = "0.1.0"
