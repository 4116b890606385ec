"""Moved to the core: :mod:`optrace.errors` (kept while the remaining imports move)."""
from optrace.errors import OptraceError

__all__ = ["OptraceError"]
