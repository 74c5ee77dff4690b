"""Where in matrix.yaml a field is written: the line a refusal names.

Every refusal names a field by its path ("cases.3.expect.cpu.match"), and a path is not
always cut at its dots: an `expect_by_arch` key is "8.0, 8.9", and a refusal about a list
item belongs at the item's own line, not the list's. `parse` keeps each mapping key's
line and refuses a key written twice (YAML would keep the last without a word); `kvrig
cells --show` reads with it, so a line it shows is the line a refusal names.

Pure: text or parsed data in, parsed data or a line out.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

LINES = "__lines__"


def line_of(data: Any, loc: Iterable[Any]) -> int | None:
    """The line of the deepest part of `loc` written in the parsed file: a mapping key's
    own line, or a list item's (its `id`'s for a case, else its first key's)."""
    line = None
    node = data
    for part in loc:
        if isinstance(node, dict):
            lines = node.get(LINES, {})
            if part in lines:
                line = lines[part]
            if part not in node:
                break
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
            line = _item_line(node) or line
        else:
            break
    return line


def where(path: Path, data: Any, *locs: tuple[Any, ...]) -> str:
    """`file:line` of the first of `locs` found in the parsed file, else the file."""
    for loc in locs:
        line = line_of(data, loc)
        if line:
            return f"{path}:{line}"
    return str(path)


def _item_line(item: Any) -> int | None:
    """A list item's line: a case's is its id's (a grouped case's shared keys are written
    above it), any other mapping's its first key's; none for a scalar."""
    lines = item.get(LINES) if isinstance(item, dict) else None
    if not lines:
        return None
    return lines.get("id") or min(lines.values())


def split_field(data: Any, dotted: str) -> tuple[Any, ...]:
    """A dotted field path as the parts it names in the parsed file: a key that holds a
    dot ("8.0, 8.9") stays whole where the file has it, a list index is a number; what the
    file does not have is cut at its dots."""
    parts: list[Any] = []
    node = data
    rest = dotted
    while rest:
        part, rest = _next_part(node, rest)
        parts.append(part)
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            node = None
    return tuple(parts)


def _next_part(node: Any, rest: str) -> tuple[Any, str]:
    """The first part of `rest` and what follows it: the longest key of `node` it starts
    with, else the text to the next dot (a number as an index)."""
    if isinstance(node, dict):
        keys = sorted((k for k in node if k != LINES), key=lambda k: len(str(k)), reverse=True)
        for key in keys:
            text = str(key)
            if rest == text or rest.startswith(text + "."):
                return key, rest[len(text) + 1 :]
    head, _, tail = rest.partition(".")
    return (int(head) if head.isdigit() else head), tail


class RepeatedKey(yaml.YAMLError):
    """A key written twice in one mapping: YAML keeps the last value without a word, so a
    second `llama:` silently swaps a model and a second `expect:` drops the first."""

    def __init__(self, key: Any, first: int, second: int) -> None:
        super().__init__(f"key {key!r} repeats")
        self.key, self.first, self.second = key, first, second


# libyaml's parser where PyYAML was built with it (its wheels are): the same nodes and marks,
# several times faster than the pure-Python one on a matrix of a thousand lines.
_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _LineLoader(_SafeLoader):  # type: ignore[misc,valid-type]
    """Keeps each mapping key's line, so a refusal or a value shown can point into the file."""


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _refuse_repeated_keys(loader: _LineLoader, node: yaml.MappingNode) -> None:
    """Only the keys written in the mapping count: one that overrides a key merged in with
    `<<:` is how YAML merges are meant to be used."""
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            continue
        key = loader.construct_object(key_node)
        line = key_node.start_mark.line + 1
        try:
            if key in seen:
                raise RepeatedKey(key, seen[key], line)
            seen[key] = line
        except TypeError:  # an unhashable key: construct_mapping refuses it at its line
            continue


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    _refuse_repeated_keys(loader, node)
    mapping = loader.construct_mapping(node, deep=True)
    lines = {}
    for key_node, _ in node.value:
        lines[loader.construct_object(key_node)] = key_node.start_mark.line + 1
    mapping[LINES] = lines  # type: ignore[index]
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _construct_timestamp(loader: _LineLoader, node: yaml.ScalarNode) -> Any:
    """A date the calendar lacks (2027-02-30) stays the text written, so the schema refuses
    it at its line; YAML's own reading raises from inside the parser, with no line."""
    try:
        return loader.construct_yaml_timestamp(node)
    except ValueError:
        return loader.construct_scalar(node)


_LineLoader.add_constructor("tag:yaml.org,2002:timestamp", _construct_timestamp)


def parse(text: str) -> Any:
    """The YAML text, every mapping keeping its keys' lines under LINES: RepeatedKey for a
    key written twice in one mapping, yaml.YAMLError for text that is no YAML."""
    return yaml.load(text, Loader=_LineLoader)
