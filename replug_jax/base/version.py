"""This package's version, below every layer: results.json records it (jobs/results_file.py) and `rj.__version__`
re-exports it, so no module inside the package imports the package root for it."""
VERSION = "0.1.0"
