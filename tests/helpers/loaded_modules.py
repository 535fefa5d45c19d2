"""Imports the modules named, then prints the name of every module loaded, sorted, on one
line (tests/test_layout.py).

    python tests/helpers/loaded_modules.py MODULE...
"""
import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

for name in sys.argv[1:]:
    importlib.import_module(name)
print(" ".join(sorted(sys.modules)))
