"""Patches read and applied in memory: exactly where they say, or refused with the reason."""

from __future__ import annotations

import pytest

from kvrig.provision import patches

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
