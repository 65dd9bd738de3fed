"""Where Protobuf message types come from, and which message an index path or a name picks.

A schema is one *root* file (its FileDescriptorProto) in a ``DescriptorPool`` that also holds everything
it imports. It comes from:

- a ``.proto`` file, compiled when the format starts by the ``protoc`` that grpcio-tools bundles (in a
  subprocess, so its error messages can be shown), with the file's directory and grpcio-tools' copy of
  the well-known types on the include path;
- a compiled descriptor set (``.desc``/``.pb``, ``protoc --descriptor_set_out``, best with
  ``--include_imports``);
- a Schema Registry, through confluent-kafka's client: the schema in its ``serialized`` form (a base64
  FileDescriptorProto) and its references (imports) resolved recursively by confluent-kafka's own
  resolver, exactly as its ``ProtobufDeserializer`` does.

Every pool is seeded with the well-known and Google/Confluent types (confluent-kafka's ``_init_pool``),
because Confluent serializers never register those as references: a reader must bring them itself.

Compatibility of a writer's message with the reader's (``incompatibility``) follows Protobuf's rules for
updating a message type: fields are matched by number, added and removed fields are fine (unknown fields
are skipped, missing ones read as their default), and a field whose type changed in a way the wire format
does not carry (e.g. string to int32) makes the writer's records unreadable into the reader schema.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message import DecodeError

from schemas.base import SchemaError

_PROTOC_TIMEOUT_S = 120
_DESCRIPTOR_SET_SUFFIXES = (".desc", ".pb", ".protoset", ".binpb")


class BadMessageIndex(LookupError):
    """A message-index path that names no message of the schema; the message says which step failed."""


@dataclass
class ProtobufSchema:
    """A root file and the pool it was added to (with its imports); ``where`` names its origin."""

    root: descriptor_pb2.FileDescriptorProto
    pool: DescriptorPool
    where: str
    _by_path: dict[tuple[int, ...], Descriptor] = field(default_factory=dict, repr=False)

    def top_level_names(self) -> list[str]:
        return [_qualified(self.root.package, m.name) for m in self.root.message_type]

    def message(self, name: str | None) -> Descriptor:
        """The message type ``name`` (full name, or a name unique among the root's top-level messages); with
        no name, the root's only top-level message. Anything else is a ``SchemaError`` listing the choices."""
        names = self.top_level_names()
        if name is None:
            if len(names) == 1:
                return self.pool.FindMessageTypeByName(names[0])
            if not names:
                raise SchemaError(f"Protobuf schema in {self.where} declares no message type")
            raise SchemaError(f"Protobuf schema in {self.where} declares {len(names)} message types "
                              f"({', '.join(names)}): set `message` to the full name of the one to use")
        try:
            return self.pool.FindMessageTypeByName(name)
        except KeyError:
            short = [full for full in names if full.rpartition(".")[2] == name]
            if len(short) == 1:
                return self.pool.FindMessageTypeByName(short[0])
        raise SchemaError(f"Protobuf schema in {self.where} has no message type {name!r} (top-level message "
                          f"types: {', '.join(names) or 'none'})")

    def declared(self, full_name: str) -> Descriptor | None:
        """The message type ``full_name`` when the root file declares it (at top level or nested), else None:
        the types of the files it imports belong to other schemas (their own subjects in a registry)."""
        try:
            found = self.pool.FindMessageTypeByName(full_name)
        except KeyError:
            return None
        return found if found.file.name == self.root.name else None

    def message_at(self, indexes: Sequence[int]) -> Descriptor:
        """The message a Confluent message-index path names: the position of the top-level message in the
        root file, then of each nested message in the one before. ``BadMessageIndex`` says which step fails."""
        key = tuple(indexes)
        found = self._by_path.get(key)
        if found is None:
            found = self._by_path[key] = self.pool.FindMessageTypeByName(self._name_at(key))
        return found

    def _name_at(self, indexes: tuple[int, ...]) -> str:
        if not indexes:
            raise BadMessageIndex("the message-index array is empty")
        name = self.root.package
        candidates = self.root.message_type
        owner = f"the schema from {self.where}"
        for depth, index in enumerate(indexes):
            if not 0 <= index < len(candidates):
                kind = "top-level" if depth == 0 else "nested"
                names = ", ".join(_qualified(name, m.name) for m in candidates) or "none"
                raise BadMessageIndex(f"{owner} has {len(candidates)} {kind} message type(s) ({names}), no index "
                                      f"{index} (step {depth + 1} of the path)")
            message = candidates[index]
            name = _qualified(name, message.name)
            candidates = message.nested_type
            owner = f"message type {name}"
        return name


def load_schema_file(path: Path) -> ProtobufSchema:
    """A ``.proto`` file (compiled now) or a compiled descriptor set, as a schema; problems are SchemaErrors."""
    path = Path(path)
    if not path.is_file():
        raise SchemaError(f"Protobuf schema file {path} does not exist")
    if path.suffix == ".proto":
        files = compile_proto(path)
        root_name = path.name
    elif path.suffix in _DESCRIPTOR_SET_SUFFIXES:
        files = read_descriptor_set(path)
        root_name = _root_file(files, where=str(path))
    else:
        raise SchemaError(f"Protobuf schema file {path}: expected a .proto file or a compiled descriptor set "
                          f"({', '.join(_DESCRIPTOR_SET_SUFFIXES)})")
    return schema_of(files, root_name, where=str(path))


def schema_of(files: Sequence[descriptor_pb2.FileDescriptorProto], root_name: str, *, where: str) -> ProtobufSchema:
    """The schema whose root is the file ``root_name`` of ``files`` (imports listed before their importers)."""
    pool = seeded_pool()
    root = None
    for file in files:
        add_file(pool, file, where=where)
        if file.name == root_name:
            root = file
    if root is None:
        raise SchemaError(f"Protobuf schema in {where}: no file '{root_name}' among {[f.name for f in files]}")
    return ProtobufSchema(root, pool, where)


def compile_proto(path: Path) -> list[descriptor_pb2.FileDescriptorProto]:
    """``path`` and everything it imports, compiled by grpcio-tools' bundled protoc into FileDescriptorProtos."""
    return _run_protoc(path.parent.resolve(), path.resolve(), where=str(path))


def compile_proto_texts(files: dict[str, str], root: str, *, where: str) -> list[descriptor_pb2.FileDescriptorProto]:
    """``.proto`` sources by import name (``root`` among them), compiled together (registry schemas in text)."""
    with tempfile.TemporaryDirectory(prefix="epochline-proto-") as tmp:
        for name, text in files.items():
            target = Path(tmp) / name
            if not target.resolve().is_relative_to(Path(tmp).resolve()):
                raise SchemaError(f"Protobuf schema in {where}: import name {name!r} leaves the source tree")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        return _run_protoc(Path(tmp), Path(tmp) / root, where=where)


def _run_protoc(include: Path, source: Path, *, where: str) -> list[descriptor_pb2.FileDescriptorProto]:
    """protoc in a subprocess (so its error messages can be shown), writing a descriptor set with the imports."""
    well_known = resources.files("grpc_tools") / "_proto"
    with tempfile.TemporaryDirectory(prefix="epochline-protoc-") as tmp:
        out = Path(tmp) / "schema.desc"
        command = [sys.executable, "-m", "grpc_tools.protoc", f"--proto_path={include}",
                   f"--proto_path={well_known}", "--include_imports", f"--descriptor_set_out={out}", str(source)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=_PROTOC_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SchemaError(f"cannot run protoc (grpcio-tools) on the Protobuf schema in {where}: {exc}") from exc
        if done.returncode != 0:
            message = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
            raise SchemaError(f"Protobuf schema in {where} does not compile: {message}")
        return read_descriptor_set(out)


def read_descriptor_set(path: Path) -> list[descriptor_pb2.FileDescriptorProto]:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SchemaError(f"cannot read Protobuf descriptor set {path}: {exc.strerror or exc}") from exc
    try:
        files = list(descriptor_pb2.FileDescriptorSet.FromString(data).file)
    except DecodeError as exc:
        raise SchemaError(f"{path} is not a compiled Protobuf descriptor set: {exc}") from exc
    if not files:
        raise SchemaError(f"Protobuf descriptor set {path} holds no file")
    return files


def seeded_pool() -> DescriptorPool:
    """A new pool holding the well-known types, google/type/* and Confluent's own (as confluent-kafka's)."""
    from confluent_kafka.schema_registry.protobuf import _init_pool

    pool = DescriptorPool()
    _init_pool(pool)
    return pool


def add_file(pool: DescriptorPool, file: descriptor_pb2.FileDescriptorProto, *, where: str) -> None:
    """Add ``file`` unless the pool already has a file of that name (the seeded well-known types)."""
    try:
        pool.FindFileByName(file.name)
    except KeyError:
        pass
    else:
        return
    try:
        pool.Add(file)
    except (TypeError, ValueError, KeyError) as exc:  # upb reports unresolved or conflicting names as these
        raise SchemaError(f"Protobuf schema in {where}: file '{file.name}' cannot be loaded: {exc}") from exc


def _root_file(files: list[descriptor_pb2.FileDescriptorProto], *, where: str) -> str:
    """The one file of a descriptor set that no other file imports (protoc lists it last)."""
    imported = {dep for f in files for dep in f.dependency}
    roots = [f.name for f in files if f.name not in imported]
    if len(roots) == 1:
        return roots[0]
    raise SchemaError(f"Protobuf descriptor set {where} holds {len(roots)} files that nothing imports "
                      f"({', '.join(roots)}): compile one .proto per descriptor set")


def _qualified(scope: str, name: str) -> str:
    return f"{scope}.{name}" if scope else name


# -- compatibility of a writer's message type with the reader's ------------------------------------------------

_F = FieldDescriptor
_WIRE_CLASS: dict[int, str] = {
    # varints: int32/int64/uint32/uint64/bool/enum read each other (numbers may be truncated, as in protoc)
    _F.TYPE_INT32: "varint", _F.TYPE_INT64: "varint", _F.TYPE_UINT32: "varint", _F.TYPE_UINT64: "varint",
    _F.TYPE_BOOL: "varint", _F.TYPE_ENUM: "varint",
    _F.TYPE_SINT32: "zigzag", _F.TYPE_SINT64: "zigzag",
    _F.TYPE_FIXED32: "fixed32", _F.TYPE_SFIXED32: "fixed32", _F.TYPE_FLOAT: "float",
    _F.TYPE_FIXED64: "fixed64", _F.TYPE_SFIXED64: "fixed64", _F.TYPE_DOUBLE: "double",
    _F.TYPE_STRING: "text", _F.TYPE_BYTES: "text",
    _F.TYPE_MESSAGE: "message", _F.TYPE_GROUP: "group",
}
_TYPE_NAMES = {value: name.removeprefix("TYPE_").lower() for name, value in vars(_F).items()
               if name.startswith("TYPE_")}


def incompatibility(writer: Descriptor, reader: Descriptor) -> str | None:
    """Why records of ``writer`` cannot be read as ``reader`` (the first clashing field), or None."""
    return _message_clash(writer, reader, path="", seen=set())


def _message_clash(writer: Descriptor, reader: Descriptor, path: str, seen: set[tuple[str, str]]) -> str | None:
    pair = (writer.full_name, reader.full_name)
    if pair in seen:  # recursive types: this pair is being compared further up
        return None
    seen.add(pair)
    for theirs in writer.fields:
        ours = reader.fields_by_number.get(theirs.number)
        if ours is None:
            continue  # a field the reader does not know: Protobuf skips it
        where = f"{path}.{ours.name}" if path else ours.name
        clash = _field_clash(theirs, ours, where, seen)
        if clash is not None:
            return clash
    return None


def _field_clash(theirs: FieldDescriptor, ours: FieldDescriptor, path: str,
                 seen: set[tuple[str, str]]) -> str | None:
    def describe(fd: FieldDescriptor) -> str:
        kind = fd.message_type.full_name if fd.message_type is not None else _TYPE_NAMES[fd.type]
        return f"repeated {kind}" if fd.is_repeated else kind

    if _WIRE_CLASS[theirs.type] != _WIRE_CLASS[ours.type] or theirs.is_repeated != ours.is_repeated:
        return f"field '{path}' (number {ours.number}) is {describe(theirs)} there and {describe(ours)} here"
    if theirs.message_type is not None and ours.message_type is not None:
        return _message_clash(theirs.message_type, ours.message_type, path, seen)
    return None
