"""The speed benchmark's parts; bench.py is its command line (see its docstring)."""
