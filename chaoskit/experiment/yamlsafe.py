"""Load YAML safely into plain data plus a map of where each value sits (line, column).

Refuses what a hostile or broken file may hold: language tags, duplicate keys,
unbounded alias expansion, binary junk, oversized files. Never raises anything
but SpecError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from chaoskit.errors import SpecError

MAX_FILE_BYTES = 1 << 20  # 1 MiB is far more than any experiment needs
MAX_NODES = 100_000  # bound on expanded nodes (defuses "billion laughs")

Path_ = tuple[str | int, ...]

_ALLOWED_TAGS = {
    "tag:yaml.org,2002:str", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null", "tag:yaml.org,2002:map",
    "tag:yaml.org,2002:seq", "tag:yaml.org,2002:timestamp",
}


@dataclass
class Located:
    """Plain data loaded from YAML and the (line, column) of every path in it (1-based)."""

    data: Any
    file: str
    positions: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    includes: dict[Path_, Located] = field(default_factory=dict)  # where an included file's mapping was merged

    def where(self, path: Path_) -> str:
        """`file:line:col` of the deepest known prefix of `path`; a key that came from an included file (and
        was not overridden beside its `include:`) is placed in that file."""
        for prefix in sorted(self.includes, key=len, reverse=True):
            n = len(prefix)
            if len(path) > n and tuple(path[:n]) == prefix and (*prefix, path[n]) not in self.positions:
                return self.includes[prefix].where(tuple(path[n:]))
        for n in range(len(path), -1, -1):
            pos = self.positions.get(tuple(path[:n]))
            if pos:
                return f"{self.file}:{pos[0]}:{pos[1]}"
        return self.file


def read_text(path: Path) -> str:
    """Read a spec file, refusing missing, oversized, binary or non-UTF-8 files with a clear message."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise SpecError(f"{path}: is a directory, expected a YAML file") from None
    except PermissionError:
        raise SpecError(f"{path}: permission denied") from None
    except OSError as e:
        raise SpecError(f"{path}: cannot read: {e.strerror}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise SpecError(f"{path}: file is {len(raw)} bytes; experiment files are limited to {MAX_FILE_BYTES}")
    if b"\x00" in raw:
        raise SpecError(f"{path}: looks like a binary file (NUL bytes), expected YAML text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise SpecError(f"{path}:{line}: not valid UTF-8 text (byte {e.start})") from None


def load_yaml(text: str, file: str) -> Located:
    """Parse one YAML document into plain data with positions; SpecError on anything odd."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark else file
        raise SpecError(f"{where}: invalid YAML: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise SpecError(f"{file}: invalid YAML: {e}") from None
    except RecursionError:
        raise SpecError(f"{file}: invalid YAML: nesting too deep") from None
    located = Located(data=None, file=file)
    if node is None:
        raise SpecError(f"{file}: the file is empty")
    builder = _Builder(located)
    try:
        located.data = builder.build(node, ())
    except RecursionError:
        raise SpecError(f"{file}: nesting too deep") from None
    return located


class _Builder:
    def __init__(self, located: Located):
        self.located = located
        self.count = 0
        self.constructor = yaml.SafeLoader("")

    def _err(self, node: yaml.Node, msg: str) -> SpecError:
        m = node.start_mark
        return SpecError(f"{self.located.file}:{m.line + 1}:{m.column + 1}: {msg}")

    def build(self, node: yaml.Node, path: Path_) -> Any:
        self.count += 1
        if self.count > MAX_NODES:
            raise self._err(node, f"document expands to more than {MAX_NODES} nodes (alias bomb?)")
        if node.tag not in _ALLOWED_TAGS:
            raise self._err(node, f"tag '{node.tag}' is not allowed; experiment files are plain YAML")
        self.located.positions.setdefault(path, (node.start_mark.line + 1, node.start_mark.column + 1))
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    raise self._err(key_node, "merge keys ('<<') are not supported")
                if not isinstance(key_node, yaml.ScalarNode):
                    raise self._err(key_node, "mapping keys must be plain scalars")
                if key_node.tag not in _ALLOWED_TAGS:
                    raise self._err(key_node, f"tag '{key_node.tag}' is not allowed in a key")
                key = str(key_node.value)
                if key in out:
                    raise self._err(key_node, f"duplicate key '{key}'")
                self.located.positions[path + (key,)] = (key_node.start_mark.line + 1,
                                                         key_node.start_mark.column + 1)
                out[key] = self.build(value_node, path + (key,))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, path + (i,)) for i, item in enumerate(node.value)]
        if node.tag == "tag:yaml.org,2002:timestamp":
            return str(node.value)  # dates stay text; nothing in a spec is a datetime
        try:
            return self.constructor.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, OverflowError) as e:
            raise self._err(node, f"bad scalar value: {e}") from None
