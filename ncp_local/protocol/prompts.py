"""Prompt packs: one template per stage, rendered from protocol state.

A pack is a folder of `<template>.txt` files (the player has one per
condition). Templates are Python `str.format` templates, as the official
ones are: `{name}` is a placeholder with PROTOCOL section 8's names, `{{` and
`}}` are literal braces. A pack is checked when it loads, before any engine
starts: every template a run needs exists, is non-empty UTF-8 text, and uses
only placeholders its stage provides (`TEMPLATE_VARS`, a view of the
stage registry `stages.STAGES`); a misspelt placeholder would otherwise
reach the model verbatim.

The official prompt files load as they are: point `prompts.dir` at a clone
of the reference repository (or its `src/ncpbench/prompts` folder inside the
clone) and `OFFICIAL_FILES` maps its file names to the rig's stages.

What each stage sees is PROTOCOL section 3 and lives in the `*_vars`
builders below; a template can only pick from what its builder provides, so
no pack can show the narrator a later story beat or a past player input.

Layout (prefix caching): prompts that share material read it first and in
the same words, the task comes last. The narrator, the conflict check and
the double-check start with the same lead (the commitments, then the
narrator's own passages so far), so a turn's conflict check reuses the
narrator prompt's prefix and the next turn's narrator reuses this one's
passages; the double-check reuses the whole conflict check. The status
check keeps the commitments and the (static) story beats before its full
history, so each turn's status check reuses the previous one's; the player
and the trajectory check share the full history the same way. The fact
update (no history) keeps its instructions first.
"""

from __future__ import annotations

import functools
import hashlib
import json
import string
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..chat import Message
from ..errors import InputError
from ..resources import PROMPTS_DIR
from .ledger import EpisodeState, Exchange, FactEntry, FactUpdate, current_node
from .spec import Node, Spec, plain_text
from .stages import STAGES

DEFAULT_DIR = PROMPTS_DIR  # the rig's own prompts/ (a clone's, or the one the wheel carries)
MAX_TEMPLATE_BYTES = 1 << 20

# Views of the stage registry (stages.STAGES), which holds each template with its placeholders.
_ALL = [(s, t) for s in STAGES.values() for t in s.templates]
# Placeholders each template may use: exactly the keys its builder provides.
TEMPLATE_VARS: dict[str, frozenset[str]] = {t.name: t.placeholders for _, t in _ALL}
# What every run of the benchmark reads; a narrator method adds its own (its class's `TEMPLATES`).
TEMPLATES: tuple[str, ...] = tuple(
    t.name for s, t in _ALL if s.role != "builder" and s.method is None and not s.optional
)
# Asked only when a run turns them on (stages.Stage.optional); a pack may leave them out and then
# lends the rig's own, and a pack holds them only when required (the run's identity hashes its pack).
OPTIONAL: tuple[str, ...] = tuple(t.name for s, t in _ALL if s.optional)
BUILD_TEMPLATES: tuple[str, ...] = tuple(t.name for s, t in _ALL if s.role == "builder")
# A template a pack may leave out because another stands in for it.
FALLBACK: dict[str, str] = {t.name: t.fallback for _, t in _ALL if t.fallback}

# The reference repository's layout: file -> the rig's template name.
OFFICIAL_PROMPTS = Path("src/ncpbench/prompts")
OFFICIAL_FILES: dict[str, str] = {
    "opening.txt": "opening",
    "adversarial_input.txt": "player_adversarial",
    "natural_input.txt": "player_natural",
    "fact_update.txt": "fact_update",
    "conflict_check.txt": "conflict_check",
    "conflict_double_check.txt": "double_check",
    "trajectory_check.txt": "trajectory_check",
    "status_check.txt": "status_check",
    "specification_trajectory.txt": "build_trajectory",
    "specification_commitments.txt": "build_commitments",
    "specification_initial_facts.txt": "build_facts",
}
OFFICIAL_METHOD_FILE = "method_response_generate_user.txt"
OFFICIAL_METHODS: dict[str, str] = {"baseline": "narrate", "hiagent": "hiagent_narrate"}
# The sha256 of each official prompt file's bytes (the reference release of 2026, MIT; hashes only,
# never the text), by the rig's template name: a run whose templates all hash to these ran on the
# official prompts (report/submission.py computes the flag from the run's manifest).
OFFICIAL_SHA256: dict[str, str] = {
    "opening": "e9fd75f3551793275a2a34f3d32a678012e4fee1f79bfabc11cf636cb857ac56",
    "player_adversarial": "b6b2d50e7e10b56ae88b7ad150e17d4795abae5cd0ca5b0c1983a02a0eff4f6e",
    "player_natural": "2e707bdb82d0cd63ff42aafaa062d3f451d2c4aade7acc3308f36fb878c46332",
    "fact_update": "14bf0a31e51587517a7d270d7ffa74e5083d8dc06e2414154a273e16272a72b4",
    "conflict_check": "2b8761e16262a87745b28e8414fd3f47a8f8efe5c7d5e412be23787804806998",
    "double_check": "353e43468819f87f52ba6516f60abe5c38198fc5f532e71ec7f83eea26b897c3",
    "trajectory_check": "73c3e8f1453ad51cf4f33f623f1208952e1bc8a4b092981a122319626b57a086",
    "status_check": "9caf4d8094ec692379e6b85c910f7384ef132b0e8cfdcff990ab06e4c480e73a",
    # The baseline's and HiAgent's method files are the same file.
    "narrate": "5467b46ceb9df38a31734705108301a26c6478d05138a2c63d7696169ec96076",
    "hiagent_narrate": "5467b46ceb9df38a31734705108301a26c6478d05138a2c63d7696169ec96076",
    "build_trajectory": "de51bdbe96758180c70c45153cb77dc76f9ebb28488f50239f51128d97088ca7",
    "build_commitments": "2a2f063dba47cd32e5e2e2f6ea6cb96a72e523d64579dbcecc72b0fa6ecf76c3",
    "build_facts": "353e8b5efcfa76dfadcd5d73bc864d38acb85df76514c1267004be5469c42b50",
}
# Templates the reference does not publish: an official pack takes the rig's own.
RIG_ONLY: tuple[str, ...] = tuple(
    n for n in TEMPLATE_VARS if n not in {*OFFICIAL_FILES.values(), *OFFICIAL_METHODS.values()}
)


def _official_root(path: Path) -> Path | None:
    """The clone's root when `path` is a reference clone or its prompts folder."""
    if (path / OFFICIAL_PROMPTS).is_dir():
        return path
    if (path / "conflict_double_check.txt").is_file() or (path / "adversarial_input.txt").is_file():
        parts = path.resolve().parts
        return Path(*parts[:-3]) if parts[-3:] == OFFICIAL_PROMPTS.parts else path
    return None


def _official_files(root: Path) -> dict[str, Path]:
    prompts = root / OFFICIAL_PROMPTS if (root / OFFICIAL_PROMPTS).is_dir() else root
    files = {name: prompts / f for f, name in OFFICIAL_FILES.items() if (prompts / f).exists()}
    for method, name in OFFICIAL_METHODS.items():
        found = sorted((root / "reference-methods" / method / "src").glob(f"*/prompts/{OFFICIAL_METHOD_FILE}"))
        if found:
            files[name] = found[0]
    return files


def _missing_name(name: str, official: bool) -> str:
    if not official:
        return f"{name}.txt"
    for f, n in OFFICIAL_FILES.items():
        if n == name:
            return f"{OFFICIAL_PROMPTS}/{f}"
    method = next((m for m, n in OFFICIAL_METHODS.items() if n == name), name)
    return f"reference-methods/{method}/src/*/prompts/{OFFICIAL_METHOD_FILE}"


def _read_template(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(path, "prompts.dir", f"cannot read: {exc.strerror}") from None
    if len(data) > MAX_TEMPLATE_BYTES:
        raise InputError(path, "prompts.dir", f"template larger than {MAX_TEMPLATE_BYTES} bytes")
    try:
        text = plain_text(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError(path, "prompts.dir", "not UTF-8 text") from None
    if "\0" in text:
        raise InputError(path, "prompts.dir", "not a text file (NUL bytes)")
    if not text.strip():
        raise InputError(path, "prompts.dir", "empty template")
    return text


def placeholders(path: Path, text: str) -> set[str]:
    """The placeholder names of a `str.format` template; anything but a plain name is refused."""
    names = set()
    try:
        fields = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise InputError(
            path, "prompts.dir", f"not a str.format template: {exc} (write a literal brace as {{{{ or }}}})"
        ) from None
    for _, name, spec, conversion in fields:
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            shown = name[:40] if name else "(empty)"
            raise InputError(
                path,
                "prompts.dir",
                f"placeholder {{{shown}}} is not a plain name (write a literal brace as {{{{ or }}}})",
            )
        names.add(name)
    return names


@dataclass(frozen=True)
class PromptPack:
    root: Path
    templates: Mapping[str, str]
    official: bool = False
    files: Mapping[str, str] = field(default_factory=dict)  # template -> the file it came from

    @classmethod
    def load(cls, root: str | Path | None = None, required: Iterable[str] = TEMPLATES) -> PromptPack:
        path = Path(root).expanduser() if root else DEFAULT_DIR
        if not path.is_dir():
            raise InputError(path, "prompts.dir", "not a directory")
        official_root = _official_root(path)
        if official_root is not None:
            files = _official_files(official_root)
            for name in RIG_ONLY:
                files.setdefault(name, DEFAULT_DIR / f"{name}.txt")
        else:
            files = {f.stem: f for f in sorted(path.glob("*.txt")) if f.stem in TEMPLATE_VARS}
        needed = list(dict.fromkeys(required))
        for name in OPTIONAL:
            if name in needed:
                files.setdefault(name, DEFAULT_DIR / f"{name}.txt")
            else:
                files.pop(name, None)
        missing = [n for n in needed if n not in files and FALLBACK.get(n) not in files]
        if missing:
            shown = ", ".join(_missing_name(m, official_root is not None) for m in missing)
            # A misspelt file name is the usual cause: name the files no stage reads.
            unread = [f.name for f in sorted(path.glob("*.txt")) if f.stem not in TEMPLATE_VARS]
            hint = f" (no stage reads {', '.join(unread[:5])}: misspelt?)" if unread and official_root is None else ""
            raise InputError(official_root or path, "prompts.dir", f"missing template(s): {shown}{hint}")
        templates: dict[str, str] = {}
        # Every template the pack has is checked (a broken one fails now, not
        # mid-run), plus the fallbacks standing in for required ones.
        standing_in = [n for n, src in FALLBACK.items() if n not in files and src in files]
        for name in dict.fromkeys([*files, *needed, *standing_in]):
            source = name if name in files else FALLBACK[name]
            f = files[source]
            text = _read_template(f)
            unknown = sorted(placeholders(f, text) - TEMPLATE_VARS[name])
            if unknown:
                allowed = ", ".join(sorted(TEMPLATE_VARS[name]))
                raise InputError(
                    f,
                    "prompts.dir",
                    f"placeholder {{{unknown[0]}}} is not provided to the {name} stage (it provides: {allowed})",
                )
            templates[name] = text
        base = official_root or path
        sources = {n: _shown(files[n if n in files else FALLBACK[n]], base) for n in templates}
        return cls(base, templates, official_root is not None, sources)

    @property
    def sha256(self) -> str:
        h = hashlib.sha256()
        for name in sorted(self.templates):
            h.update(name.encode() + b"\0" + self.templates[name].encode() + b"\0")
        return h.hexdigest()

    def history_in(self, template: str, variables: Mapping[str, str]) -> Placed | None:
        """Where `render`'s text holds the first history among `variables` (`rendered`); None when no
        placeholder of the template holds one whole (the text's strip would cut into it), or one before
        it is not a plain name (its text is not its value)."""
        at, lead, blank = 0, 0, True  # `lead`: the blanks strip() removes from the start
        head: list[str] = []
        parts = _parts(self.templates[template])
        for k, (literal, name) in enumerate(parts):
            value = variables[name] if name else ""
            if name == "" or not isinstance(value, str):
                return None
            for piece in (literal, value):
                if blank:
                    kept = piece.lstrip()
                    lead += len(piece) - len(kept)
                    blank = not kept
            if isinstance(value, History):
                # strip() must leave the history whole: something not blank before it and after it.
                after = (x for lit, n in parts[k + 1 :] for x in (lit, variables[n] if n else ""))
                if lead > at + len(literal) or not any(x and not x.isspace() for x in after):
                    return None
                return Placed(at + len(literal) - lead, (*head, literal), value.grown)
            head += (literal, value)
            at += len(literal) + len(value)
        return None

    def render(
        self, template: str, variables: Mapping[str, str], feedback: str = "", extra: str | None = None
    ) -> tuple[Message, ...]:
        """One user message; `extra` names a second template appended after the first."""
        text = _stripped(self.templates[template], variables)
        if extra is not None:
            text += "\n\n" + _stripped(self.templates[extra], variables)
        if feedback:
            # A re-ask after a failed cross-check goes last, after the item itself.
            text += f"\n\nYOUR PREVIOUS ANSWER WAS REJECTED. Fix these problems:\n{feedback}"
        return (Message("user", text),)


def _stripped(template: str, variables: Mapping[str, str]) -> str:
    """`template.format_map(variables).strip()`, made as one join of the template's parts and values.

    `format_map` grows its text as it writes it; past about 100 kB (a prompt past turn 50) glibc then
    hands the memory back and faults it in again on every call: 80 us where the join, which sizes its text
    once, takes 3 (issue 67). Nor is the prompt copied again when only the template's own ends are
    blank, as a file's last newline is: stripping what a template begins and ends with first leaves the
    same text to strip."""
    parts = _joinable(template)
    try:
        text = template.strip().format_map(variables) if parts is None else "".join(_values(parts, variables))
    except TypeError:  # a value that is not text: format_map writes it as str() would
        text = template.strip().format_map(variables)
    return text.strip() if text[:1].isspace() or text[-1:].isspace() else text


def _values(parts: tuple[tuple[str, str | None], ...], variables: Mapping[str, str]) -> list[str]:
    return [x for literal, name in parts for x in ((literal, variables[name]) if name is not None else (literal,))]


@functools.cache
def _joinable(template: str) -> tuple[tuple[str, str | None], ...] | None:
    """The parts of the template stripped (`_parts`) when its every field is a plain name (all
    `PromptPack.load` admits); else None. Keyed by the template as the pack holds it, whose hash Python
    keeps: not by its stripped copy, made and hashed anew on every call."""
    parts = _parts(template.strip())
    return None if any(name == "" for _, name in parts) else parts


@functools.cache
def _parts(template: str) -> tuple[tuple[str, str | None], ...]:
    """A template as (literal, the placeholder after it: None at its end) pairs. `PromptPack.load` admits
    only plain names; any other field (a hand-made pack) reads as "", which `history_in` cannot place."""
    return tuple(
        (literal, name if name is None or (name.isidentifier() and not spec and not conversion) else "")
        for literal, name, spec, conversion in string.Formatter().parse(template)
    )


def _shown(f: Path, base: Path) -> str:
    try:
        return str(f.resolve().relative_to(base.resolve()))
    except ValueError:
        return f"(rig) {f.name}"


# ---- formatting of state into placeholder values -------------------------

NONE = "(none)"


def format_facts(facts: Iterable[FactEntry]) -> str:
    lines = [f"- [{f.id}] {f.text}" for f in facts if f.active]
    return "\n".join(lines) or NONE


class _Memo:
    """What a state keeps of its own texts (a private attribute): equal to any other, so that it never
    tells two states apart (pydantic compares private attributes)."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = None  # type: ignore[assignment]


class _FactsText(_Memo):
    """`format_facts` of one ledger (`facts`), kept on the state that holds it."""

    __slots__ = ("facts", "text")

    def __init__(self, facts: tuple[FactEntry, ...], text: str) -> None:
        self.facts, self.text = facts, text


def shown_facts(state: EpisodeState) -> str:
    """`format_facts(state.facts)`, made once per ledger, not once per prompt that shows it."""
    memo = state._facts_text
    if memo is None or memo.facts is not state.facts:  # (a state made from another carries its memo)
        memo = state._facts_text = _FactsText(state.facts, format_facts(state.facts))
    text: str = memo.text
    return text


def format_commitments(spec: Spec, status: Mapping[str, str] | None) -> str:
    """Each commitment with its conditions; with its status inline when `status` is given."""

    def head(cid: str, ctype: str) -> str:
        return f"({ctype}, status: {status.get(cid, 'pending')})" if status is not None else f"({ctype})"

    blocks = [
        f"[{c.id}] {head(c.id, c.type)} {c.description}\n  satisfied when: {c.satisfaction_condition}\n"
        f"  violated when: {c.violation_condition}"
        for c in spec.commitments
    ]
    return "\n".join(blocks) or NONE


def format_commitment_statuses(spec: Spec, state: EpisodeState) -> str:
    status = state.status_map
    return ", ".join(f"{c.id}: {status.get(c.id, 'pending')}" for c in spec.commitments) or NONE


def _node_lines(n: Node, with_description: bool = True) -> str:
    head = f"[{n.id}] {n.description}" if with_description else f"[{n.id}]"
    return f"{head}\n  trigger: {n.trigger_event}\n  delta: {n.key_delta}"


def format_nodes(spec: Spec) -> str:
    """Every story beat with its trigger and delta (auditors only; never the narrator)."""
    return "\n".join(_node_lines(n) for n in spec.trajectory) or NONE


def format_flags(spec: Spec, occurred: tuple[bool, ...]) -> str:
    return ", ".join(
        f"{n.id}: {'occurred' if done else 'pending'}" for n, done in zip(spec.trajectory, occurred, strict=True)
    )


def format_trajectory(spec: Spec, occurred: tuple[bool, ...]) -> str:
    """The whole trajectory ledger: status, description, trigger and delta per node."""
    return (
        "\n".join(
            f"[{n.id}] (status: {'occurred' if done else 'pending'}) {n.description}\n"
            f"  trigger: {n.trigger_event}\n  delta: {n.key_delta}"
            for n, done in zip(spec.trajectory, occurred, strict=True)
        )
        or NONE
    )


def format_node(spec: Spec, index: int, with_description: bool = True) -> str:
    return _node_lines(spec.trajectory[index], with_description)


def format_history(opening: str, exchanges: Iterable[tuple[str, str]]) -> str:
    parts = [f"NARRATOR: {opening}"]
    for player_input, response in exchanges:
        parts.append(f"PLAYER: {player_input}")
        parts.append(f"NARRATOR: {response}")
    return "\n\n".join(parts)


def first_line(text: str) -> str:
    return text.strip().split("\n", 1)[0].strip()


def format_responses(opening: str, responses: Iterable[str], cut_to_first_line: bool = False) -> str:
    """The narrator's own passages, numbered; the reference's narrator sees each cut to its first line."""
    texts = [opening, *responses]
    if cut_to_first_line:
        texts = [first_line(t) for t in texts]
    return "\n\n".join(f"[{i}] {r}" for i, r in enumerate(texts))


# A state's history as the prompts show it, by kind: (its start from the opening, what exchange i adds).
# The texts `format_history` and `format_responses` make, one exchange at a time.
_HISTORY: dict[str, tuple[Callable[[str], str], Callable[[int, Exchange], str]]] = {
    "history": (lambda o: f"NARRATOR: {o}", lambda i, e: f"\n\nPLAYER: {e.player_input}\n\nNARRATOR: {e.response}"),
    "responses": (lambda o: f"[0] {o}", lambda i, e: f"\n\n[{i}] {e.response}"),
    "first_lines": (lambda o: f"[0] {first_line(o)}", lambda i, e: f"\n\n[{i}] {first_line(e.response)}"),
}


@dataclass(frozen=True, eq=False)
class Grown:
    """What a history text was rendered from: its first `pure` characters are the `kind` rendering of
    `opening` and `exchanges` (what may follow was added to it, e.g. the turn in progress)."""

    kind: str
    opening: str
    exchanges: tuple[Exchange, ...]
    pure: int

    def kept_by(self, later: Grown) -> int:
        """How many characters at the start of `later`'s text are this one's: its whole rendering when
        `later`'s history continues this one (a rendering only grows at its end, exchange by exchange:
        `_HISTORY`); 0 when it does not."""
        n = len(self.exchanges)
        if later.kind != self.kind or later.opening != self.opening or len(later.exchanges) < n:
            return 0
        return self.pure if later.exchanges[:n] == self.exchanges else 0


@dataclass(frozen=True, eq=False)
class Placed:
    """Where a prompt's text holds a history: at `at`, after `head` (the pieces of text before it, the
    same text when they are equal: what the template and the values before the history write), and
    what the history was rendered from."""

    at: int
    head: tuple[str, ...]
    history: Grown


class History(str):
    """A history as the prompts show it, which knows what it was rendered from (`grown`): a prompt
    holding it can then tell, from a few fields rather than its text, how much of it an earlier prompt
    held (the admission then hashes only the rest of the prompt, execution/admission.py)."""

    grown: Grown

    def __new__(cls, text: str, grown: Grown) -> History:
        made = super().__new__(cls, text)
        made.grown = grown
        return made

    def __getnewargs__(self) -> tuple[str, Grown]:  # type: ignore[override]
        return str(self), self.grown

    def plus(self, more: str) -> History:
        """This history with `more` after it (a turn in progress): the same rendering first."""
        return History(self + more, self.grown)


class _Rendered(_Memo):
    """The texts of one history (`opening`, `exchanges`), by kind: an episode's state keeps it (its
    `_rendered`), so that each turn renders only the exchange it adds, not the whole history once per
    call (at turn 100 that was most of a call's cost). Never changed once another state may hold it,
    except to add a kind."""

    __slots__ = ("opening", "exchanges", "texts")

    def __init__(self, opening: str, exchanges: tuple[Exchange, ...], texts: dict[str, History]) -> None:
        self.opening, self.exchanges, self.texts = opening, exchanges, texts

    def extended(self, opening: str, exchanges: tuple[Exchange, ...]) -> _Rendered:
        """The texts of a history that continues this one (the same texts when it is this one)."""
        if exchanges is self.exchanges and opening == self.opening:
            return self
        done = len(self.exchanges)
        if opening != self.opening or len(exchanges) < done or exchanges[:done] != self.exchanges:
            return _Rendered(opening, exchanges, {})  # not a continuation: rendered anew
        texts = {
            k: _history(
                k,
                opening,
                exchanges,
                t + "".join(_HISTORY[k][1](i, e) for i, e in enumerate(exchanges[done:], done + 1)),
            )
            for k, t in self.texts.items()
        }
        return _Rendered(opening, exchanges, texts)


def _history(kind: str, opening: str, exchanges: tuple[Exchange, ...], text: str) -> History:
    return History(text, Grown(kind, opening, exchanges, len(text)))


def rendered(state: EpisodeState, kind: str) -> History:
    """`format_history` ("history") or `format_responses` ("responses"; cut to first lines: "first_lines")
    of the state's history, rendering only what it added since a state it was made from."""
    memo = state._rendered
    memo = _Rendered(state.opening, (), {}) if memo is None else memo
    memo = memo.extended(state.opening, state.exchanges)
    if kind not in memo.texts:
        start, add = _HISTORY[kind]
        text = start(state.opening) + "".join(add(i, e) for i, e in enumerate(state.exchanges, 1))
        memo.texts[kind] = _history(kind, state.opening, state.exchanges, text)
    state._rendered = memo
    return memo.texts[kind]


def format_update(update: FactUpdate, facts: Iterable[FactEntry]) -> str:
    lines = [f"+ add: {a}" for a in update.add_facts if a.strip()]
    if update.negate_facts:  # (the ledger's texts by id only then: about 200 facts at turn 100)
        text = {f.id: f.text for f in facts}
        lines += [f"- negate [{i}] {text.get(i, '(unknown)')}" for i in update.negate_facts]
    return "\n".join(lines) or NONE


def to_json(obj: object) -> str:
    return json.dumps(obj, ensure_ascii=False, indent=1)


# ---- what each stage sees (PROTOCOL section 3) ----------------------------
# Each builder returns exactly the placeholder values of its stage
# (TEMPLATE_VARS); templates pick what they use. History strings only ever
# grow at the end between turns.


# spec id() -> (the spec, its commitments' definitions, its beats): a spec's own texts, the same on every
# call, so made once per spec, not per call; one string each, which a prompt's head then shares
# (execution/admission.py compares the heads of a stage's prompts: the same object is the cheapest).
_SPEC_TEXTS: dict[int, tuple[Spec, str, str]] = {}


def _spec_texts(spec: Spec) -> tuple[str, str]:
    held = _SPEC_TEXTS.get(id(spec))  # (an entry holds its spec: no other object gets that id meanwhile)
    if held is None:
        if len(_SPEC_TEXTS) >= 4096:  # (a long-lived process that loads datasets over and over)
            _SPEC_TEXTS.clear()
        held = _SPEC_TEXTS[id(spec)] = (spec, format_commitments(spec, None), format_nodes(spec))
    return held[1], held[2]


def _commitments(spec: Spec, state: EpisodeState) -> dict[str, str]:
    return {
        "narrative_commitments": format_commitments(spec, state.status_map),
        "commitment_definitions": _spec_texts(spec)[0],
        "commitment_statuses": format_commitment_statuses(spec, state),
    }


def _audit_story(spec: Spec, state: EpisodeState, occurred: tuple[bool, ...]) -> dict[str, str]:
    return {
        **_commitments(spec, state),
        "trajectory_progress": format_trajectory(spec, occurred),
        "trajectory_nodes": _spec_texts(spec)[1],
        "trajectory_flags": format_flags(spec, occurred),
    }


def opening_vars(spec: Spec, state: EpisodeState) -> dict[str, str]:
    # The first node only: never a later beat.
    facts = shown_facts(state)
    return {
        "player_role": spec.meta.player_role,
        "current_node": format_node(spec, 0),
        **_commitments(spec, state),
        "pre_turn_facts": facts,
        "facts": facts,
    }


def narrate_vars(
    spec: Spec, state: EpisodeState, player_input: str, first_line_history: bool = False
) -> dict[str, str]:
    """The baseline narrator's information set: the current node only, its own past passages (not the
    player's past inputs), commitments with status, the committed facts, the pending updates, this input."""
    facts = shown_facts(state)
    return {
        "player_role": spec.meta.player_role,
        "current_node": format_node(spec, current_node(state.node_occurred)),
        **_commitments(spec, state),
        "pre_turn_facts": facts,
        "facts": facts,
        "pending_fact_updates": format_update(state.pending, state.facts),
        "system_response_history": rendered(state, "first_lines" if first_line_history else "responses"),
        "user_input": player_input,
    }


def player_vars(spec: Spec, state: EpisodeState) -> dict[str, str]:
    # The player sees its role and the visible history, nothing else.
    return {
        "player_role": spec.meta.player_role,
        "history_text": rendered(state, "history"),
    }


def fact_update_vars(spec: Spec, seen: EpisodeState, response: str) -> dict[str, str]:
    """`seen`: the state before the turn, its pending updates applied (ledger.with_facts)."""
    # No history and no player input: the auditor judges the passage alone.
    facts = shown_facts(seen)
    return {"player_role": spec.meta.player_role, "pre_turn_facts": facts, "facts": facts, "response_text": response}


def conflict_vars(
    spec: Spec, seen: EpisodeState, player_input: str, response: str, update: FactUpdate
) -> dict[str, str]:
    """`seen`: the state before the turn, its pending updates applied (ledger.with_facts)."""
    facts = shown_facts(seen)
    return {
        "player_role": spec.meta.player_role,
        "system_response_history": rendered(seen, "responses"),
        "user_input": player_input,
        "response_text": response,
        "candidate_fact_updates": format_update(update, seen.facts),
        **_audit_story(spec, seen, seen.node_occurred),
        "current_node": format_node(spec, current_node(seen.node_occurred)),
        "pre_turn_facts": facts,
        "facts": facts,
    }


def trajectory_vars(spec: Spec, node_index: int, updated: EpisodeState, history: str) -> dict[str, str]:
    """`updated`: the state with the turn's fact update applied (ledger.with_facts)."""
    # The node is shown without its description: only trigger and delta count.
    return {
        "player_role": spec.meta.player_role,
        "history_text": history,
        "facts": shown_facts(updated),
        "current_node": format_node(spec, node_index, with_description=False),
    }


def status_vars(spec: Spec, updated: EpisodeState, occurred: tuple[bool, ...], history: str) -> dict[str, str]:
    """`updated`: the state with the turn's fact update applied (ledger.with_facts); `occurred`: the
    nodes after this turn's trajectory check."""
    return {
        "player_role": spec.meta.player_role,
        "history_text": history,
        "facts": shown_facts(updated),
        **_audit_story(spec, updated, occurred),
    }
