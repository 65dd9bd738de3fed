"""YAML read with bounds: the one loader for connector config files and for the worker's YAML request bodies.

Why bounds: YAML aliases (``*name``) repeat what an anchor (``&name``) holds without repeating its text, so a
few hundred bytes nesting aliases of aliases (the "billion laughs") stand for billions of values. PyYAML
shares the aliased objects, so parsing is quick, but everything that walks the result (validation, JSON
encoding for the worker's config topic) expands them: a worker held its API for seconds and grew by tens of
megabytes on one such body. So a document is refused before it is built when its text is larger than
``MAX_YAML_BYTES``, when it nests deeper than the parser can follow, or when its aliases would expand it
beyond ``MAX_EXPANDED_SIZE``, counted as nodes plus scalar characters; a recursive alias is refused too.
Aliases within the bound (a shared block of settings) keep working.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode

MAX_YAML_BYTES = 1 << 20
"""A connector config with its schemas inline is kilobytes; a mebibyte is far more than any needs."""
MAX_EXPANDED_SIZE = 4 * MAX_YAML_BYTES
"""Nodes plus scalar characters once every alias is expanded: a few times what the text may hold."""


class YamlRefused(yaml.YAMLError):
    """A YAML document too large, too deep, recursive, or expanding too far through its aliases."""


class BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that measures a document's expanded size before building it."""

    def construct_document(self, node: Node) -> Any:
        _expanded_size(node, {}, set())
        return super().construct_document(node)


def read_yaml(text: bytes | str) -> Any:
    """The one YAML document in ``text``, safely loaded within the bounds; ``YamlRefused`` says which bound,
    any other ``yaml.YAMLError`` where the text does not parse."""
    size = len(text.encode() if isinstance(text, str) else text)
    if size > MAX_YAML_BYTES:
        raise YamlRefused(f"the YAML has {size} bytes, more than {MAX_YAML_BYTES}")
    try:
        return yaml.load(text, Loader=BoundedLoader)
    except RecursionError:
        raise YamlRefused("the YAML nests deeper than it can be read") from None


def _expanded_size(node: Node, sizes: dict[int, int], open_nodes: set[int]) -> int:
    """The size of ``node`` with every alias expanded, each shared node measured once (so a bomb is measured
    in a few steps); raises as soon as a part is over ``MAX_EXPANDED_SIZE``."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_nodes:
        raise YamlRefused(f"the YAML has a recursive alias (line {node.start_mark.line + 1})")
    if isinstance(node, ScalarNode):
        size = 1 + len(node.value)
    else:
        open_nodes.add(key)
        children = [part for pair in node.value for part in pair] if isinstance(node, MappingNode) else node.value
        size = 1 + sum(_expanded_size(child, sizes, open_nodes) for child in children)
        open_nodes.discard(key)
    if size > MAX_EXPANDED_SIZE:
        raise YamlRefused(f"the YAML's aliases (*name) expand it to more than {MAX_EXPANDED_SIZE} values and "
                          "characters; write the repeated parts out or repeat less")
    sizes[key] = size
    return size
