"""Shared by the Python tests: the checkout's package comes first on the
path (make test and make test-gpu run them from the repository without
installing it; test_install.py checks the installed one)."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
