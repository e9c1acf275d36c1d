"""Shared helpers of stoker's tests (not test modules): tiny models and data, process launching,
store helpers, and the helpers of the recipe, AdaNet and data tests. ``tests/`` is on the import
path (``pythonpath`` in pyproject.toml for pytest; the scripts in ``helpers/scripts/`` insert it
themselves), so they import as ``from helpers.tiny import make_estimator``. conftest.py registers
this package for pytest's assertion rewriting, so the asserts here report like a test's."""
