"""The release diff on hand-built records of two releases' emulated CUDA 9.0 cells: which
moves kvrig's rule switches explain, and which are red."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from kvrig.define import named_release
from kvrig.define.cells import Cell, expand
from kvrig.define.matrix import Matrix
from kvrig.publish import release_diff as rd

from ..builders import gpu_matrix


def _cells(version: str, arch: str = "9.0", **case: Any) -> Cell:
    data = gpu_matrix(**case)
    matrix = Matrix.model_validate(copy.deepcopy(data))
    matrix = named_release.apply(matrix, ["cuda"], named_release.parse(version))
    return expand(matrix, "cuda", gpu_arch=arch, device_emulated=True)[0]


def _ran(block: int, kernels: list[int] | None = None, backend: str = "FLASH_ATTN") -> dict:
    """A configured hybrid: a Mamba group, then an attention group, as vLLM groups them."""
    state_kernel, kernel = kernels if kernels is not None else [block, block]
    return {
        "outcome": "configured",
        "worker_block_size": block,
        "kernel_block_sizes": [state_kernel, kernel],
        "layer_backends": {"model.layers.0.mixer": "MAMBA2_ATTN", "model.layers.1.a": backend},
        "kv_cache_groups": [
            {"backends": ["MAMBA2_ATTN"], "kernel_block_size": state_kernel},
            {"backends": [backend], "kernel_block_size": kernel},
        ],
    }


def _early(block: int, *names: str) -> dict:
    message = (
        f"Aligned KV cache block size {block} is not supported by attention backend(s):"
        f" {', '.join(names)}."
    )
    return {
        "outcome": "error",
        "error": {
            "type": "ValueError",
            "message": message,
            "function": "_check_aligned_block_size",
        },
        "kv_cache_sized_before_error": False,
        "layer_backends": {"model.layers.1.a": "FLASH_ATTN"},
    }


OLD = rd.Side("0.33.0", "0.33.0")
NEW = rd.Side("0.34.0", "0.34.0")


def _pair(old: dict, new: dict, arch: str = "9.0", **case: Any) -> rd.CellPair:
    column = f"cuda-sm{arch.replace('.', '')}-emulated"
    return rd.CellPair(
        column, _cells("0.33.0", arch, **case), _cells("0.34.0", arch, **case), old, new
    )


def test_the_new_start_size_explains_granite_moving_from_144_to_192() -> None:
    found = rd.diff([_pair(_ran(144), _ran(192))], OLD, NEW)
    assert found.compared == 1 and len(found.moves) == 1
    move = found.moves[0]
    assert move.explained, move.why
    assert move.aspects == ("block",)  # the kernel sizes follow the block: not a move
    assert move.switches and move.switches[0].startswith("default_block_size 16 -> 64")
    assert "a run at 144 -> a run at 192" in move.why
    assert not found.red
    assert "explained: 1 cells compared" in rd.summary(found)


def test_nothing_moved_is_no_move() -> None:
    assert rd.diff([_pair(_ran(144), _ran(144))], OLD, OLD).moves == []


def test_a_size_the_rules_do_not_compute_is_red() -> None:
    found = rd.diff([_pair(_ran(144), _ran(256))], OLD, NEW)
    move = found.moves[0]
    assert not move.explained and found.red
    assert "vLLM 0.34.0 did a run at 256; its rules compute a run at 192" in move.why


def test_a_move_where_both_releases_rules_agree_is_red_and_names_the_unread_side() -> None:
    patched = rd.Side("0.34.0 with the Python of x.diff", "0.34.0", unread="a patch")
    pair = rd.CellPair(
        "cuda-sm90-emulated", _cells("0.34.0"), _cells("0.34.0"), _ran(192), _ran(256)
    )
    move = rd.diff([pair], NEW, patched).moves[0]
    assert not move.explained
    assert "its rules compute a run at 192" in move.why


def test_moves_the_rules_cannot_speak_of_are_red() -> None:
    found = rd.diff([_pair(_ran(144), _ran(192, backend="FLASHINFER"))], OLD, NEW)
    move = found.moves[0]
    assert not move.explained
    assert "vLLM 0.34.0 chose FLASHINFER; its rules compute FLASH_ATTN" in move.why
    # FLASH_ATTN (MultipleOf(16)) takes a 192-token block whole: 64 is not the worker's.
    found = rd.diff([_pair(_ran(144), _ran(192, kernels=[192, 64]))], OLD, NEW)
    move = found.moves[0]
    assert not move.explained and "kernels" in move.aspects
    assert "FLASH_ATTN split into kernel blocks of 64; its rules compute N" in move.why


def test_flashinfer_s_kernel_blocks_follow_the_block_on_sm100() -> None:
    """FLASHINFER (16, 32, 64, read exactly by the worker) splits 144 into 16s and 192 into
    64s: the kernels move with the block, and the rules compute both."""
    old, new = _ran(144, [144, 16], "FLASHINFER"), _ran(192, [192, 64], "FLASHINFER")
    move = rd.diff([_pair(old, new, arch="10.0")], OLD, NEW).moves[0]
    assert move.aspects == ("block", "kernels")
    assert move.explained, move.why
    assert "the worker's kernel blocks 16 -> 64 follow" in move.why
    # On an A100 the rules pick FLASH_ATTN, which takes either block whole.
    move = rd.diff([_pair(old, new, arch="8.0")], OLD, NEW).moves[0]
    assert not move.explained
    assert "vLLM 0.33.0: a group of FLASHINFER, backends its rules do not choose" in move.why


def test_a_state_group_s_kernel_move_is_beyond_the_rules() -> None:
    move = rd.diff([_pair(_ran(144), _ran(192, kernels=[256, 192]))], OLD, NEW).moves[0]
    assert not move.explained
    assert "the state groups' kernel blocks: N -> 256" in move.why


def test_a_kernel_move_without_recorded_groups_is_red() -> None:
    old, new = _ran(144, [144, 16], "FLASHINFER"), _ran(192, [192, 64], "FLASHINFER")
    del old["kv_cache_groups"], new["kv_cache_groups"]
    move = rd.diff([_pair(old, new, arch="10.0")], OLD, NEW).moves[0]
    assert not move.explained and "no KV-cache groups recorded" in move.why


def test_an_early_error_that_moved_with_the_start_is_explained() -> None:
    # An exact [16, 64] sibling takes either start; alignment lands past both.
    sizes = [16, 64]
    sibling = {"siblings": [{"name": "KVRIG_SIBLING", "layers": "model.layers.3.", "sizes": sizes}]}
    case = {
        "crafted": sibling,
        "expect": {"cuda": {"outcome": "early_error", "backends": ["KVRIG_SIBLING"]}},
    }
    assert rd.predict(_cells("0.33.0", **case))[0] == rd.Predicted(
        "early_error", 144, ("KVRIG_SIBLING",), ("FLASH_ATTN", "KVRIG_SIBLING")
    )
    pair = _pair(_early(144, "KVRIG_SIBLING"), _early(192, "KVRIG_SIBLING"), **case)
    move = rd.diff([pair], OLD, NEW).moves[0]
    assert move.explained, move.why
    assert move.aspects == ("block",)
    # The same move naming another backend than the rules compute is red.
    pair = _pair(_early(144, "KVRIG_SIBLING"), _early(192, "FLASH_ATTN"), **case)
    assert not rd.diff([pair], OLD, NEW).moves[0].explained


def test_a_cell_missing_on_one_side_is_red() -> None:
    found = rd.diff([_pair(_ran(144), None)], OLD, NEW)  # type: ignore[arg-type]
    assert found.red and found.missing and "no record on 0.34.0" in found.missing[0]


def test_a_literal_size_the_new_release_moves_is_a_matrix_change_for_review() -> None:
    expect = {"cuda": {"outcome": "runs", "invariants": {"block_size": 144}}}
    found = rd.diff([_pair(_ran(144), _ran(192), expect=expect)], OLD, NEW)
    assert [c.what for c in found.changes] == ["cuda (9.0): block size 144 -> 192"]
    text = rd.terminal(found)
    assert "for review; nothing was applied" in text and "144 -> 192" in text
    assert "UNEXPLAINED" not in text


def test_an_outcome_the_new_release_contradicts_is_a_matrix_change() -> None:
    found = rd.diff([_pair(_ran(144), _early(192, "FLASH_ATTN"))], OLD, NEW)
    assert any("expected runs, the release shows an early error" in c.what for c in found.changes)


def test_the_texts_carry_every_move_and_the_verdict() -> None:
    found = rd.diff([_pair(_ran(144), _ran(192)), _pair(_ran(144), _ran(256))], OLD, NEW)
    md = rd.markdown(found, "t")
    page = rd.to_html(found, "t")
    assert md.count("`cuda-sm90-emulated-granite_hybrid-c`") == 2 and "**UNEXPLAINED**" in md
    assert "class='red'" in page and "class='ok'" in page
    data = rd.as_json(found)
    assert data["red"] is True and len(data["moves"]) == 2


def _rocm_pair(arch: str, old: dict, new: dict, **case: Any) -> rd.CellPair:
    def cell(version: str) -> Cell:
        data = gpu_matrix(**case)
        data["platforms"]["rocm"] = {
            "vllm": {"kind": "image", "image": "vllm/vllm-openai-rocm:v0.33.0"},
            "base_image": "rocm/dev-ubuntu-24.04:7.0-complete",
            "default_backend": "ROCM_ATTN",
            "crafted_route": "custom",
        }
        data["cases"][0]["expect"] = {"rocm": {"outcome": "runs"}}
        matrix = named_release.apply(
            Matrix.model_validate(data), ["rocm"], named_release.parse(version)
        )
        return expand(matrix, "rocm", gpu_arch=arch, device_emulated=True)[0]

    return rd.CellPair(f"rocm-{arch}-emulated", cell("0.33.0"), cell("0.34.0"), old, new)


def test_rocm_s_new_first_backend_on_gfx1201_explains_its_backend_and_size_moves() -> None:
    pair = _rocm_pair("gfx1201", _ran(144, backend="ROCM_ATTN"), _ran(192, backend="TRITON_ATTN"))
    move = rd.diff([pair], OLD, NEW).moves[0]
    assert move.aspects == ("block", "backends")
    assert move.explained, move.why
    assert any(s.startswith("rocm_triton_first_on_gfx1201") for s in move.switches)
    # On gfx942 the same move is no release's doing: ROCM_ATTN stays first.
    pair = _rocm_pair("gfx942", _ran(144, backend="ROCM_ATTN"), _ran(192, backend="TRITON_ATTN"))
    move = rd.diff([pair], OLD, NEW).moves[0]
    assert not move.explained
    assert "vLLM 0.34.0 did a run at 192; its rules compute a run at 144" in move.why


def test_an_error_that_moved_only_in_the_backend_and_config_it_names_is_no_error_move() -> None:
    def late(backend: str, fields: str) -> dict:
        message = (
            f"No common block size for 48 ({backend}: [MultipleOf(16)]; KVRIG_SIBLING: [24])"
            f" in SelectorConfig({fields})."
        )
        return {
            "outcome": "error",
            "error": {"type": "ValueError", "message": message, "function": "f"},
            "kv_cache_sized_before_error": True,
            "worker_block_size": 48,
            "layer_backends": {"a": backend, "b": "KVRIG_SIBLING"},
        }

    old = rd.observe(late("ROCM_ATTN", "x=1"))
    new = rd.observe(late("TRITON_ATTN", "x=1, y=2"))
    assert old.error.endswith("in SelectorConfig(...).")
    pair = _rocm_pair("gfx1201", late("ROCM_ATTN", "x=1"), late("TRITON_ATTN", "x=1, y=2"))
    move = rd.diff([pair], OLD, NEW).moves[0]
    assert move.aspects == ("backends",)
    assert new.attention == ("KVRIG_SIBLING", "TRITON_ATTN")


def _declaring(record: dict, sizes: list[str]) -> dict:
    return {**record, "backend_kernel_sizes": {"FLASH_ATTN": sizes, "MAMBA2_ATTN": ["N"]}}


def test_a_backend_declaring_other_kernel_sizes_is_listed_once_with_the_cells_it_touches() -> None:
    """A change of 0.34.0 whose FLASH_ATTN declares multiples of 32: the sizes chosen need
    not move, but the release moved what every computed size reads."""
    pairs = [
        _pair(
            _declaring(_ran(192), ["MultipleOf(16)"]),
            _declaring(_ran(192), ["MultipleOf(32)"]),
            arch,
        )
        for arch in ("9.0", "8.0")
    ]
    found = rd.diff(pairs, NEW, NEW)
    assert found.moves == [] and found.red
    [change] = found.declared
    assert (change.platform, change.backend, change.old, change.new) == (
        "cuda",
        "FLASH_ATTN",
        ("MultipleOf(16)",),
        ("MultipleOf(32)",),
    )
    assert change.cells == tuple(p.old_cell.id for p in pairs)
    assert change.red and "kvrig's table [MultipleOf(16)]" in str(change.table)
    text = rd.terminal(found)
    assert (
        text.count("cuda: FLASH_ATTN declares MultipleOf(16) -> MultipleOf(32) (2 cell(s): ") == 1
    )
    assert "1 backend(s) declaring other kernel sizes (1 not as kvrig's table" in rd.summary(found)
    # Towards the sizes kvrig's table holds: listed, and not red.
    back = rd.diff([_pair(*[p.new_record for p in pairs][:1], pairs[0].old_record)], NEW, NEW)
    assert [c.red for c in back.declared] == [False] and not back.red
    assert "kvrig's backend table holds the new sizes" in rd.terminal(back)
    assert "FLASH_ATTN declares" in rd.markdown(found, "t") and "id=declared" in rd.to_html(
        found, "t"
    )
    assert rd.as_json(found)["declared"][0]["cells"] == list(change.cells)
    # A crafted sibling's sizes follow the cell (`aligned`), not the release.
    sibling = {"name": "KVRIG_SIBLING", "layers": "model.layers.1.", "sizes": ["aligned", 16]}
    crafted = [
        {**_ran(n), "backend_kernel_sizes": {"KVRIG_SIBLING": [str(n), "16"]}} for n in (144, 192)
    ]
    assert rd.diff([_pair(*crafted, crafted={"siblings": [sibling]})], OLD, NEW).declared == []
    # The same declarations on both sides: nothing to list.
    same = _pair(
        _declaring(_ran(192), ["MultipleOf(16)"]), _declaring(_ran(192), ["MultipleOf(16)"])
    )
    assert rd.diff([same], NEW, NEW).declared == []


def test_an_early_error_reworded_is_said_to_no_longer_read_as_the_checks_and_quoted() -> None:
    reworded = copy.deepcopy(_early(192, "KVRIG_SIBLING"))
    reworded["error"]["message"] = "Block size 192 is refused by KVRIG_SIBLING."
    found = rd.diff([_pair(_early(192, "KVRIG_SIBLING"), reworded)], OLD, NEW)
    [move] = found.moves
    assert not move.explained and found.red
    assert "0.34.0's early error (_check_aligned_block_size) no longer reads as the check's" in (
        move.why
    )
    assert "'Block size 192 is refused by KVRIG_SIBLING.'" in move.why
    text = rd.terminal(found)
    assert "None" not in text and "naming ;" not in text


def _refused(block: int, message: str, function: str = "_promote_local_kv_cache_specs") -> dict:
    return {
        "outcome": "error",
        "error": {"type": "ValueError", "message": message, "function": function},
        "kv_cache_sized_before_error": False,
        "worker_block_size": block,
        "layer_backends": {"model.layers.1.a": "FLASH_ATTN"},
    }


def test_a_refusal_on_both_sides_does_not_move_with_the_block_it_had_reached() -> None:
    said = "Failed to promote local KV cache specs to one unified type."
    assert rd.explain(_pair(_refused(144, said), _refused(192, said)), OLD, NEW) is None
    other = _refused(192, "Something else.")
    assert rd.explain(_pair(_refused(144, said), other), OLD, NEW) is not None


def test_the_selector_s_reasons_are_read_in_name_order() -> None:
    """The order is the platform's priority (a backends' move a switch explains), not the
    error's; what each backend is refused for still is."""

    def refused(reasons: str) -> dict:
        text = f"No valid attention backend found for rocm. Reasons: {{{reasons}}}."
        return _refused(8, text, "get_attn_backend_cls")

    rocm_first = rd.observe(refused("ROCM_ATTN: [block_size], TRITON_ATTN: [DCP]")).error
    triton_first = rd.observe(refused("TRITON_ATTN: [DCP], ROCM_ATTN: [block_size]")).error
    assert rocm_first == triton_first
    assert "Reasons: {ROCM_ATTN: [block_size], TRITON_ATTN: [DCP]}" in rocm_first
    assert rd.observe(refused("ROCM_ATTN: [DCP], TRITON_ATTN: [DCP]")).error != rocm_first


def test_a_group_of_smaller_pages_is_split_by_its_own_block() -> None:
    """An fp8 group beside a bf16 one holds twice the tokens a block: its kernel block is
    its own block's split, not the worker's."""
    record = _ran(288)
    record["kv_cache_groups"].append(
        {"backends": ["FLASH_ATTN"], "kernel_block_size": 576, "block_size": 576}
    )
    seen = rd.observe(record)
    predicted, _ = rd.predict(_cells("0.34.0"))
    assert predicted is not None and rd.kernel_problem(seen, predicted) is None
    record["kv_cache_groups"][-1]["block_size"] = 288
    problem = rd.kernel_problem(rd.observe(record), predicted)
    assert "split into kernel blocks of 576" in str(problem)


def test_a_block_outermost_layout_keeps_every_kernel_block_whole() -> None:
    seen = rd.observe(_ran(192, [192, 192], backend="FLASHINFER"))
    predicted, _ = rd.predict(_cells("0.34.0", arch="10.0"))
    assert predicted is not None
    assert "its rules compute 64" in str(rd.kernel_problem(seen, predicted))
    whole = dataclasses.replace(predicted, whole_kernel_blocks=True)
    assert rd.kernel_problem(seen, whole) is None


def test_a_refusal_of_the_configuration_selects_no_backend() -> None:
    refused = {
        "knobs": {"mamba_block_size": 96, "enable_prefix_caching": False},
        "expect": {
            "cuda": {
                "outcome": "unsupported",
                "error": "ValidationError",
                "function": "__init__",
                "match": "--mamba-block-size can only be set",
            }
        },
    }
    predicted, _ = rd.predict(_cells("0.34.0", **refused))
    assert predicted is not None and predicted.kind == "unsupported"
    assert predicted.backends == ()


def test_a_refusal_the_engine_core_makes_after_selection_has_its_backends() -> None:
    """Chunked multimodal input off in align mode is refused by VllmConfig.
    validate_block_size, which the engine core calls once the layers have their backends."""
    refused = {
        "knobs": {"disable_chunked_mm_input": True},
        "expect": {
            "cuda": {
                "outcome": "unsupported",
                "error": "AssertionError",
                "function": "validate_block_size",
                "match": "Chunked MM input is required",
            }
        },
    }
    predicted, _ = rd.predict(_cells("0.34.0", **refused))
    assert predicted is not None and predicted.kind == "unsupported"
    assert predicted.backends == ("FLASH_ATTN",)  # the attention layers had theirs


FA_FP8 = {
    "knobs": {"attention_backend": "FLASH_ATTN", "kv_cache_dtype": "fp8"},
    "expect": {
        "cuda": {
            "outcome": "unsupported",
            "error": "ValueError",
            "function": "get_attn_backend_cls",
            "match": "Selected backend AttentionBackendEnum.FLASH_ATTN is not valid",
        }
    },
}


def test_a_refusal_reworded_after_the_rules_words_is_listed_and_not_red() -> None:
    said = "Selected backend AttentionBackendEnum.FLASH_ATTN is not valid for this configuration."

    def refused(reason: str) -> dict:
        return _refused(144, f"{said} Reason: [{reason!r}]", "get_attn_backend_cls")

    old, new = refused("FP8 KV cache requires FA3 on SM90"), refused("FP8 KV requires FA3 (SM90).")
    found = rd.diff([_pair(old, new, arch="8.0", **FA_FP8)], OLD, NEW)
    (move,) = found.moves
    assert move.reworded and move.explained and not found.red, move.why
    assert "1 the same refusal reworded, 0 unexplained" in rd.summary(found)
    assert "reworded" in rd.terminal(found)
    # Words that no longer open with the refusal the rules hold are a move to read: red.
    other = _refused(144, "No valid attention backend found for cuda.", "get_attn_backend_cls")
    found = rd.diff([_pair(old, other, arch="8.0", **FA_FP8)], OLD, NEW)
    assert found.red and not found.moves[0].reworded
