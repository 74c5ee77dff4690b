"""The base of every model of matrix.yaml's schema, and the field types its sections share.

Below every section (kvrig.define.platform_spec, kvrig.define.case_spec,
kvrig.define.schema), so that none of them imports another for what they all use.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictInt

# A model's or a case's name: it becomes part of a cell's id, a folder and a pytest id.
NAME = r"^[a-z0-9][a-z0-9_]*$"
# An attention backend's name, as vLLM's AttentionBackendEnum spells its members.
BACKEND_NAME = r"^[A-Z][A-Z0-9_]*$"
# A size or a count: a whole number of at least 1, written as one. YAML's `true` is no
# size and "128" is text; read as numbers they would be a block size of 1 and a size the
# file does not show, and a size of 0 or below is none vLLM can have.
Count = Annotated[StrictInt, Field(gt=0)]


class Strict(BaseModel):
    """Unknown keys refused (a misspelt one is no silent default), values frozen (one
    validated matrix is shared by everyone who asks for it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
