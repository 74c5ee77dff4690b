"""A platform's pin_overrides in matrix.yaml: each maps a release's exact pin to the one
to take instead, of the same package; an empty one is as if unwritten (no row is
re-judged for the field's arrival), a written one is part of what cells are judged under."""

from __future__ import annotations

import pytest

from kvrig.define.cells import Cell, expand, judged_under
from kvrig.define.matrix import Matrix, MatrixError, load
from kvrig.define.platform_spec import package_key

MAPPING = {"flashinfer-python==0.7.3": "flashinfer_python==0.7.4"}


def test_a_pin_override_loads_and_goes_with_the_platform(write_matrix, base) -> None:
    base["platforms"]["cpu"]["pin_overrides"] = MAPPING
    spec = load(write_matrix(base)).platforms["cpu"]
    assert spec.pin_overrides == MAPPING
    cell = expand(Matrix.model_validate(base), "cpu")[0]
    assert Cell.model_validate_json(cell.model_dump_json()).platform_spec.pin_overrides == MAPPING


@pytest.mark.parametrize(
    "mapping",
    [
        {"flashinfer-python==0.7.3": "torch==2.14.0"},  # another package
        {"flashinfer-python>=0.7.3": "flashinfer-python==0.7.4"},  # not a pin
        {"flashinfer-python==0.7.3": "flashinfer-python"},
        {"flashinfer-python==0.7.*": "flashinfer-python==0.7.4"},
    ],
)
def test_a_pin_override_that_is_none_is_refused_with_its_line(write_matrix, base, mapping) -> None:
    base["platforms"]["cpu"]["pin_overrides"] = mapping
    with pytest.raises(MatrixError) as err:
        load(write_matrix(base))
    msg = str(err.value)
    assert "platforms.cpu.pin_overrides" in msg
    assert "both PKG==VER of the same package" in msg
    assert msg.split(": the matrix")[0].rsplit(":", 1)[1].isdigit()  # its line


def test_no_pin_override_is_as_if_the_field_did_not_exist(base) -> None:
    plain = expand(Matrix.model_validate(base), "cpu")[0]
    assert "pin_overrides" not in plain.platform_spec.model_dump()
    base["platforms"]["cpu"]["pin_overrides"] = MAPPING
    pinned = expand(Matrix.model_validate(base), "cpu")[0]
    assert pinned.platform_spec.model_dump()["pin_overrides"] == MAPPING
    assert judged_under(pinned) != judged_under(plain)  # another environment: re-judged


def test_package_names_compare_as_indexes_compare_them() -> None:
    assert (
        package_key("Flashinfer_Python")
        == package_key("flashinfer.python")
        == ("flashinfer-python")
    )
