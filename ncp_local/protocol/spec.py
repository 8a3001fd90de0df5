"""Load, validate and lint environments in the official NCP-Bench format.

PROTOCOL section 1. Every error names the file and the field; lint findings
are warnings, never errors.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from ..errors import InputError, shown

CommitmentType = Literal["invariant", "ordering", "achievement"]
COMMITMENT_TYPES: tuple[str, ...] = ("invariant", "ordering", "achievement")
SPEC_KEYS: tuple[str, ...] = ("meta", "synopsis", "initial_facts", "commitments", "trajectory")
NODE_REF = re.compile(r"\bs_\d+\b")
# Ids become file names and appear in prompts and reports: printable, short,
# no path separators, not starting with '.' (hidden, '..') or '-' (an option).
ID_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
ID_RULE = "1-64 characters from A-Z a-z 0-9 _ . -, not starting with . or -"
# Bounds on what a YAML file may cost to read (official specs: under 60 kB, 4 levels deep).
MAX_YAML_BYTES = 16 * 1024 * 1024
MAX_YAML_DEPTH = 32


@dataclass(frozen=True)
class Meta:
    id: str
    title: str
    genres: tuple[str, ...]
    player_role: str


@dataclass(frozen=True)
class InitialFact:
    id: str
    content: str
    negated: bool = False


@dataclass(frozen=True)
class Commitment:
    id: str
    type: CommitmentType
    description: str
    satisfaction_condition: str
    violation_condition: str


@dataclass(frozen=True)
class Node:
    id: str
    description: str
    trigger_event: str
    key_delta: str


@dataclass(frozen=True)
class Spec:
    meta: Meta
    synopsis: str
    initial_facts: tuple[InitialFact, ...]
    commitments: tuple[Commitment, ...]
    trajectory: tuple[Node, ...]

    @property
    def id(self) -> str:
        return self.meta.id


@dataclass(frozen=True)
class LintWarning:
    file: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"warning: {self.file}: {self.field}: {self.message}"


@dataclass(frozen=True)
class Dataset:
    root: Path
    specs: tuple[Spec, ...]
    warnings: tuple[LintWarning, ...]
    sha256: str  # over the index and every spec file, in index order


def is_plain_id(value: str) -> bool:
    return ID_PATTERN.fullmatch(value) is not None


class Reader:
    """Typed field access that reports the exact path of what is wrong."""

    def __init__(self, file: Path) -> None:
        self.file = file

    def fail(self, field: str, message: str) -> InputError:
        return InputError(self.file, field, message)

    def mapping(self, value: Any, field: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(field, f"expected a mapping, got {type(value).__name__}")
        return value

    def seq(self, value: Any, field: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(field, f"expected a list, got {type(value).__name__}")
        return value

    def text(self, parent: dict[str, Any], key: str, field: str) -> str:
        if key not in parent:
            raise self.fail(field, "missing")
        value = parent[key]
        if not isinstance(value, str):
            raise self.fail(field, f"expected a string, got {type(value).__name__}")
        if not value.strip():
            raise self.fail(field, "empty")
        return value

    def ident(self, parent: dict[str, Any], key: str, field: str) -> str:
        value = self.text(parent, key, field)
        if not is_plain_id(value):
            raise self.fail(field, f"{shown(value)} is not a plain id ({ID_RULE})")
        return value


# libyaml's scanner and parser (C) under PyYAML's own composer (Python), whose `compose_node` the checks
# below extend: reading the official 100 specs takes 1.2 s instead of 4.6 (the pure-Python scanner's).
_PARSER: Any = getattr(yaml.cyaml, "CParser", None) if yaml.__with_libyaml__ else None
_SCANNING: tuple[Any, ...] = (_PARSER,) if _PARSER else (yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser)


class _StrictLoader(yaml.composer.Composer, yaml.constructor.SafeConstructor, yaml.resolver.Resolver, *_SCANNING):  # type: ignore[misc]
    """Safe YAML with what a spec never needs refused: a repeated key (last-one-wins
    would silently drop data), anchors and aliases (an alias bomb expands
    exponentially when shown or walked), nesting deeper than MAX_YAML_DEPTH
    (the composer recurses: RecursionError)."""

    def __init__(self, stream: str) -> None:
        if _PARSER is not None:
            _PARSER.__init__(self, stream)
        else:  # no libyaml: PyYAML's own scanner and parser
            yaml.reader.Reader.__init__(self, stream)
            yaml.scanner.Scanner.__init__(self)
            yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        yaml.resolver.Resolver.__init__(self)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(
                None, None, "anchors and aliases (&name, *name) are not allowed", event.start_mark
            )
        if self._depth >= MAX_YAML_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", event.start_mark
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    repeated = key in seen
                except TypeError:
                    continue  # unhashable: the base constructor reports it with its line
                if repeated:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {shown(key)}", key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep)


def parse_yaml(text: str) -> Any:
    """One YAML document read the strict way (`_StrictLoader`); raises yaml.YAMLError."""
    loader = _StrictLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def plain_text(text: str) -> str:
    """Text as the rig reads every file it is given (specs, indexes, prompt packs, build sources):
    a leading UTF-8 BOM dropped and universal newlines (CRLF and CR are LF), so a file saved on
    Windows reads, runs and hashes as the same file with LF line ends."""
    return text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")


def text_bytes(data: bytes) -> bytes:
    """A text file's bytes as they are hashed (identity, seals, digests): its `plain_text` in UTF-8;
    bytes that are not UTF-8 as they are (loading refuses them)."""
    try:
        return plain_text(data.decode("utf-8")).encode("utf-8")
    except UnicodeDecodeError:
        return data


def read_yaml(path: Path) -> Any:
    try:
        size = path.stat().st_size
        if size > MAX_YAML_BYTES:
            raise InputError(path, "", f"{size} bytes: larger than the {MAX_YAML_BYTES} a spec file may be")
        text = plain_text(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise InputError(path, "", "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, "", f"cannot read: {shown(exc, 200)}") from None
    try:
        return parse_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "yaml"
        problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
        problem = problem if len(problem) <= 160 else problem[:157] + "..."  # PyYAML quotes tags and tokens
        raise InputError(path, where, f"invalid YAML: {problem}") from None


def unique(r: Reader, items: list[Any], section: str) -> None:
    seen: set[str] = set()
    for i, item in enumerate(items):
        if item.id in seen:
            raise r.fail(f"{section}[{i}].id", f"duplicate id {shown(item.id)}")
        seen.add(item.id)


def read_meta(r: Reader, value: Any, field: str) -> Meta:
    """id, title, genres and player_role of a mapping at `field` (a spec's meta, a build source)."""
    m = r.mapping(value, field)
    if "genres" not in m:
        raise r.fail(f"{field}.genres", "missing")
    genres = []
    for i, g in enumerate(r.seq(m["genres"], f"{field}.genres")):
        if not isinstance(g, str) or not g.strip():
            raise r.fail(f"{field}.genres[{i}]", "expected a non-empty string")
        genres.append(g)
    return Meta(
        id=r.ident(m, "id", f"{field}.id"),
        title=r.text(m, "title", f"{field}.title"),
        genres=tuple(genres),
        player_role=r.text(m, "player_role", f"{field}.player_role"),
    )


def parse_spec(data: Any, file: Path, expected_id: str | None = None) -> Spec:
    """Validate one spec document (already parsed YAML)."""
    r = Reader(file)
    doc = r.mapping(data, "(top level)")
    for key in SPEC_KEYS:
        if key not in doc:
            raise r.fail(key, "missing")
    extra = sorted(set(doc) - set(SPEC_KEYS))
    if extra:
        raise r.fail(extra[0], f"unknown top-level key (expected {', '.join(SPEC_KEYS)})")

    meta = read_meta(r, doc["meta"], "meta")
    if expected_id is not None and meta.id != expected_id:
        raise r.fail("meta.id", f"{shown(meta.id)} does not equal the file stem {shown(expected_id)}")
    if not isinstance(doc["synopsis"], str) or not doc["synopsis"].strip():
        raise r.fail("synopsis", "expected a non-empty string")

    facts = []
    for i, raw in enumerate(r.seq(doc["initial_facts"], "initial_facts")):
        f = r.mapping(raw, f"initial_facts[{i}]")
        negated = f.get("negated", False)
        if not isinstance(negated, bool):
            raise r.fail(f"initial_facts[{i}].negated", f"expected true or false, got {shown(negated)}")
        facts.append(
            InitialFact(
                id=r.ident(f, "id", f"initial_facts[{i}].id"),
                content=r.text(f, "content", f"initial_facts[{i}].content"),
                negated=negated,
            )
        )
    unique(r, facts, "initial_facts")

    commitments = []
    for i, raw in enumerate(r.seq(doc["commitments"], "commitments")):
        c = r.mapping(raw, f"commitments[{i}]")
        ctype = r.text(c, "type", f"commitments[{i}].type")
        if ctype not in COMMITMENT_TYPES:
            raise r.fail(f"commitments[{i}].type", f"{shown(ctype)} is not one of {', '.join(COMMITMENT_TYPES)}")
        commitments.append(
            Commitment(
                id=r.ident(c, "id", f"commitments[{i}].id"),
                type=ctype,  # type: ignore[arg-type]
                description=r.text(c, "description", f"commitments[{i}].description"),
                satisfaction_condition=r.text(c, "satisfaction_condition", f"commitments[{i}].satisfaction_condition"),
                violation_condition=r.text(c, "violation_condition", f"commitments[{i}].violation_condition"),
            )
        )
    unique(r, commitments, "commitments")

    nodes = []
    for i, raw in enumerate(r.seq(doc["trajectory"], "trajectory")):
        n = r.mapping(raw, f"trajectory[{i}]")
        nodes.append(
            Node(
                id=r.ident(n, "id", f"trajectory[{i}].id"),
                description=r.text(n, "description", f"trajectory[{i}].description"),
                trigger_event=r.text(n, "trigger_event", f"trajectory[{i}].trigger_event"),
                key_delta=r.text(n, "key_delta", f"trajectory[{i}].key_delta"),
            )
        )
    if not nodes:
        raise r.fail("trajectory", "empty: an episode needs at least one node")
    unique(r, nodes, "trajectory")

    return Spec(meta, doc["synopsis"], tuple(facts), tuple(commitments), tuple(nodes))


def load_spec(path: str | Path) -> Spec:
    path = Path(path)
    return parse_spec(read_yaml(path), path, expected_id=path.stem)


@functools.lru_cache(maxsize=512)
def _known_spec(path: str, data: bytes) -> Spec:
    """A spec file parsed once per process for the same path and bytes (specs are frozen): a submitted or
    batched sweep loads its dataset once per point, and the pure-Python YAML reader costs about 25 ms a
    spec. Changed bytes are parsed again; a bad file raises each time (exceptions are not kept)."""
    return load_spec(path)


def lint_spec(spec: Spec, file: str | Path) -> list[LintWarning]:
    """Findings worth a look that do not stop a run."""
    file = str(file)
    out: list[LintWarning] = []
    for i, f in enumerate(spec.initial_facts):
        if f.negated:
            out.append(
                LintWarning(
                    file,
                    f"initial_facts[{i}].negated",
                    f"{f.id} is negated at t=0: it starts inactive and is never shown",
                )
            )
    node_ids = {n.id for n in spec.trajectory}
    for i, c in enumerate(spec.commitments):
        text = " ".join((c.description, c.satisfaction_condition, c.violation_condition))
        missing = sorted(set(NODE_REF.findall(text)) - node_ids, key=lambda s: int(s[2:]))
        if missing:
            out.append(
                LintWarning(
                    file, f"commitments[{i}]", f"{c.id} names node(s) the trajectory lacks: {', '.join(missing)}"
                )
            )
    return out


def dataset_digest(index_bytes: bytes, spec_bytes: Iterable[bytes]) -> str:
    """A dataset's digest: its index, then each spec file in index order (recorded in manifests)."""
    digest = hashlib.sha256(index_bytes)
    for data in spec_bytes:
        digest.update(data)
    return digest.hexdigest()


def load_dataset(root: str | Path, limit: int | None = None) -> Dataset:
    """Load `index.yaml` and every spec it lists, in index order.

    Every spec is validated (even past `limit`) so that a bad file fails the
    run before any model loads, not hours into it.
    """
    root = Path(root)
    index_path = root / "index.yaml"
    if not root.is_dir():
        raise InputError(root, "dataset.path", "not a directory")
    r = Reader(index_path)
    index = r.mapping(read_yaml(index_path), "(top level)")
    if "specs" not in index:
        raise r.fail("specs", "missing")
    ids = r.seq(index["specs"], "specs")
    if not ids:
        raise r.fail("specs", "empty")
    spec_bytes: list[bytes] = []
    seen: set[str] = set()
    specs: list[Spec] = []
    warnings: list[LintWarning] = []
    for i, sid in enumerate(ids):
        if not isinstance(sid, str) or not is_plain_id(sid):
            raise r.fail(f"specs[{i}]", f"{shown(sid)} is not a plain spec id ({ID_RULE})")
        if sid in seen:
            raise r.fail(f"specs[{i}]", f"duplicate spec id {shown(sid)}")
        seen.add(sid)
        path = root / "specs" / f"{sid}.yaml"
        if not path.is_file():
            raise r.fail(f"specs[{i}]", f"{shown(sid)} has no file {path}")
        data = path.read_bytes()
        spec_bytes.append(text_bytes(data))
        spec = _known_spec(str(path), data)
        specs.append(spec)
        warnings.extend(lint_spec(spec, path))
    if limit is not None:
        specs = specs[:limit]
    return Dataset(root, tuple(specs), tuple(warnings), dataset_digest(text_bytes(index_path.read_bytes()), spec_bytes))


def dataset_summary(ds: Dataset) -> str:
    facts = sum(len(s.initial_facts) for s in ds.specs)
    commitments = sum(len(s.commitments) for s in ds.specs)
    nodes = sum(len(s.trajectory) for s in ds.specs)
    by_type = {t: sum(c.type == t for s in ds.specs for c in s.commitments) for t in COMMITMENT_TYPES}
    genres = sorted({g for s in ds.specs for g in s.meta.genres})
    return (
        f"specs={len(ds.specs)} facts={facts} commitments={commitments} nodes={nodes} "
        + " ".join(f"{t}={n}" for t, n in by_type.items())
        + f" genres={len(genres)} warnings={len(ds.warnings)}"
    )
