"""Bounded YAML loading for config files and ``--set`` values (bad input: docs/bad-inputs.md).

`yaml.safe_load` is safe from code execution but not from size: a 2 KB file of nested aliases
(``&a [*b, *b, ...]``) stands for billions of values that every later consumer (the override
merge, pydantic, the resolved-config dump) walks one by one; an alias inside its own anchor is a
cycle that no walk ends; a few thousand ``[`` exhaust Python's recursion; and a repeated key
silently drops the first section. `load_yaml` refuses all of these while the document is composed,
before any value is built, so memory and time stay bounded by the text's size.
"""
from __future__ import annotations

from typing import Any

import yaml
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

#: largest config file read (the project's own configs are under 6 KB)
MAX_CONFIG_BYTES = 256 * 1024
#: most values a document may stand for, each alias counted as often as it is used
MAX_NODES = 100_000
#: deepest nesting of sections and lists (the project's configs nest 4 deep)
MAX_DEPTH = 64

_MERGE_TAG = "tag:yaml.org,2002:merge"


class YamlRefused(yaml.YAMLError):
    """YAML text that parses but is refused before it is built; the message is one line."""


class _BoundedLoader(yaml.SafeLoader):
    """A SafeLoader that measures every node as it is composed and refuses repeated keys."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        # id(node) -> (node, values it stands for, nesting depth); the node is kept so ids stay unique
        self._measured: dict[int, tuple[Node, int, int]] = {}

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        mark = self.peek_event().start_mark
        if self.check_event(AliasEvent):
            anchor = self.peek_event().anchor
            node = super().compose_node(parent, index)
            if id(node) not in self._measured:  # the anchor is still open: the alias is inside it
                raise YamlRefused(f"line {mark.line + 1}: alias *{anchor} refers to a value that "
                                  f"contains the alias itself (an endless value); write the value out")
            return node
        if self._depth >= MAX_DEPTH:
            raise YamlRefused(f"line {mark.line + 1}: values nest more than {MAX_DEPTH} levels deep; a config "
                              f"nests a few levels (section, key, list), so flatten it")
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        self._measure(node, mark.line + 1)
        return node

    def _measure(self, node: Node, line: int) -> None:
        children = _children(node)
        stats = [self._measured[id(child)] for child in children]
        size = 1 + sum(s[1] for s in stats)
        depth = 1 + max((s[2] for s in stats), default=0)
        if size > MAX_NODES:
            raise YamlRefused(f"line {line}: the value stands for more than {MAX_NODES:,} values once its "
                              f"aliases (*name) are expanded; write the config out without nested aliases")
        if depth > MAX_DEPTH:
            raise YamlRefused(f"line {line}: values nest more than {MAX_DEPTH} levels deep once aliases (*name) "
                              f"are expanded; flatten the config")
        self._measured[id(node)] = (node, size, depth)

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        _refuse_repeated_keys(self, node)
        return super().construct_mapping(node, deep=deep)


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _refuse_repeated_keys(loader: yaml.SafeLoader, node: MappingNode) -> None:
    """YAML keeps the last of two equal keys; a config that says a section twice means both."""
    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, ScalarNode) or key_node.tag == _MERGE_TAG:
            continue  # `<<: *base` overriding keys of base is what merge keys are for
        key = loader.construct_object(key_node)
        line = key_node.start_mark.line + 1
        if key in first_line:
            raise YamlRefused(f"key {key!r} appears twice (lines {first_line[key]} and {line}); YAML would "
                              f"silently keep only the second, so merge the two into one")
        first_line[key] = line


def load_yaml(text: str) -> Any:
    """Parse one YAML document with safe tags only, bounded in size, nesting and alias expansion.

    Raises `YamlRefused` (a `yaml.YAMLError`) for what is refused, any other `yaml.YAMLError` for
    text that is not YAML, both with one-line messages.
    """
    if len(text) > MAX_CONFIG_BYTES:
        raise YamlRefused(f"the text is {len(text):,} characters, more than the {MAX_CONFIG_BYTES:,} a config may "
                          f"hold; pass a config file such as configs/quickstart.yaml")
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    except (ValueError, OverflowError) as exc:  # a timestamp like 2024-13-45, an int of 5,000 digits
        reason = " ".join(str(exc).split(";")[0].split())[:160]  # not Python's advice (set_int_max_str_digits)
        raise YamlRefused(f"a value cannot be read ({reason}); write it as a plain number or string") from None
    finally:
        loader.dispose()
