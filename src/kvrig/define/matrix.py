"""The matrix as the rest of kvrig asks for it: the validated Matrix, the error a file
that cannot be used raises, and `load`, the one way to read one.

Its schema is kvrig.define.schema (with kvrig.define.platform_spec and
kvrig.define.case_spec), its reading kvrig.define.loader; every layer above kvrig.define
needs only these three names, so they stay here whatever those modules hold.
"""

from __future__ import annotations

from kvrig.define.loader import load
from kvrig.define.schema import Matrix, MatrixError

__all__ = ["Matrix", "MatrixError", "load"]
