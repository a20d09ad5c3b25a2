"""The code version stamped on every sample's meta (``code_version``) and on the package
(pyproject reads it from here, so the two never disagree)."""
__version__ = "0.1.0"
