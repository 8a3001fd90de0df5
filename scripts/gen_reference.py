"""The documentation site's reference, generated from the code so it cannot drift.

Before the site builds, `make docs` runs `python scripts/gen_reference.py --site build/docs`: a copy of
docs/ in which every `<!-- gen:NAME -->` line of a page is replaced by the Markdown `generate(NAME)`
returns (an unknown name fails), and `changelog.md` is the root CHANGELOG.md. mkdocs.yml builds that
copy (`docs_dir: build/docs`), so any builder that reads mkdocs.yml (MkDocs, Zensical) builds the same
pages with nothing of its own to run. The sources:

- config: the config tree under conf/ (every key of config.yaml and of the group files, with the
  comment beside it or the comment lines right above it) and the keys the validator accepts that no
  file sets (ncp_local/config/, engines/settings.py, protocol/stages.Bounds, with their comments);
- modes: the `MODES` table (ncp_local/modes/_registry.py);
- exits: ncp_local/exits.py;
- columns, cost-columns, endings-columns, trials-columns: the glossary (ncp_local/report/glossary.py);
- records: the record models a run directory's files are read with (pydantic);
- tables: the analysis tables' schemas (ncp_local/report/table_schema.py).

A conf/ key with no description is an error here (the build fails) and in
tests/test_docs.py::test_every_config_key_has_a_description.

    python scripts/gen_reference.py             # the names it generates
    python scripts/gen_reference.py config      # one section's Markdown
    python scripts/gen_reference.py --check     # exit 1, naming each conf/ key with no description
    python scripts/gen_reference.py --site DIR  # docs/ with its sections generated, into DIR (replaced)
"""

from __future__ import annotations

import inspect
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
if str(ROOT) not in sys.path:  # this tree's package, whatever the current folder
    sys.path.insert(0, str(ROOT))
ROLES = ("narrator", "player", "auditor")
MARKER = re.compile(r"^<!-- gen:([a-z-]+) -->$", re.MULTILINE)

# Where each group's keys sit in the composed config, and the option config.yaml picks by default.
GROUPS: dict[str, tuple[str, str]] = {
    "engine": ("engine", "vllm"),
    "dataset": ("dataset", "local"),
    "method": ("method", "baseline"),
    "condition": ("condition", "adversarial"),
    "narrator": ("<role>", "smollm2"),
    "player": ("<role>", "smollm2"),
    "auditor": ("<role>", "smollm2"),
    "model": ("<role>.model", "smollm2"),
    "tracker": ("tracker", "none"),
}
# Groups whose files only choose or set keys defined above (listed as options, keys not read).
PRESET_GROUPS = ("experiment", "hydra/launcher")
# config.yaml keys that are Hydra's, not the rig's.
HYDRA_KEYS = ("defaults", "hydra")
# Mappings whose keys are free (passed on as they are): their contents are a value, not keys.
FREE = ("engine_args", "chat_template_kwargs", "hf_overrides", "sweep")


# ---- conf/ files: keys and the comments that describe them -------------------------------------------


@dataclass(frozen=True)
class Key:
    path: str  # as a user writes it: `plan.gpus`, `<role>.model.thinking`
    value: str  # as the file writes it
    description: str
    file: str  # relative to the repository


_KEY_LINE = re.compile(r"^(\s*)([A-Za-z_][A-Za-z0-9_]*):(?:\s+(.*))?$")


def _split_comment(rest: str) -> tuple[str, str]:
    """`value  # comment` -> (value, comment); a `#` inside quotes is not a comment."""
    quote = ""
    for i, ch in enumerate(rest):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or rest[i - 1].isspace()):
            return rest[:i].strip(), rest[i + 1 :].strip()
    return rest.strip(), ""


def file_keys(path: Path) -> list[tuple[str, str, str]]:
    """(dotted key, value, description) for every key of a block mapping in a conf file, in file order.

    A key's description is its own comment, else the comment lines right above it (no blank line
    between). A flow mapping (`{a: 1}`) is one value: its keys are free (e.g. `engine_args`). The
    comment block that opens a group file describes the option, not its first key."""
    out: list[tuple[str, str, str]] = []
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    seen_key = False
    skip: int | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.strip()
        if not text:
            pending = []
            continue
        if text.startswith("#"):
            pending.append(text.lstrip("#").strip())
            continue
        m = _KEY_LINE.match(line)
        if not m or text.startswith("- "):
            pending = []
            continue
        indent, key = len(m[1]), m[2]
        if skip is not None and indent > skip:
            continue
        skip = None
        value, comment = _split_comment(m[3] or "")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        opening = not seen_key and path.parent != CONF  # a group file's header is the option's
        seen_key = True
        description = comment or ("" if opening else " ".join(pending))
        out.append((".".join([k for _, k in stack] + [key]), value, description))
        pending = []
        if value == "" and key in FREE:
            skip = indent  # a free mapping's keys (a model's engine_args) are its value, not keys
        elif value == "" or value.startswith("&"):
            stack.append((indent, key))
    return out


def header(path: Path) -> str:
    """A conf file's opening comment (after `# @package` lines), as one paragraph."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if text.startswith("@package"):
            continue
        if not text:
            break  # the header's first paragraph
        lines.append(text)
    return " ".join(lines)


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def conf_keys() -> list[Key]:
    """Every key conf/ sets (config.yaml and the groups' files), as a user writes it."""
    keys: list[Key] = []
    for dotted, value, desc in file_keys(CONF / "config.yaml"):
        top = dotted.split(".")[0]
        if top in HYDRA_KEYS or value.startswith("*"):
            continue
        if top in ROLES:  # the role block (`narrator: &role_engine`): every role has it
            dotted = "<role>" + dotted[len(top) :]
        keys.append(Key(dotted, value, desc, "conf/config.yaml"))
    for group, (prefix, _) in GROUPS.items():
        for path in sorted((CONF / group).glob("*.yaml")):
            for dotted, value, desc in file_keys(path):
                if dotted.split(".")[0] == "defaults":
                    continue
                keys.append(Key(f"{prefix}.{dotted}", value, desc, _rel(path)))
    return keys


def documented() -> dict[str, Key]:
    """One entry per key: its default option's line when that file sets it, and a description from
    any file of its group (the first that has one)."""
    by_path: dict[str, list[Key]] = {}
    for k in conf_keys():
        by_path.setdefault(k.path, []).append(k)
    defaults = {f"conf/{g}/{opt}.yaml" for g, (_, opt) in GROUPS.items()} | {"conf/config.yaml"}
    out = {}
    for path, found in by_path.items():
        main = next((k for k in found if k.file in defaults), found[0])
        desc = main.description or next((k.description for k in found if k.description), "")
        out[path] = Key(path, main.value, desc, main.file)
    return out


def undocumented() -> list[Key]:
    """conf/ keys with no description in any file of their group: each must get a comment."""
    return [k for k in documented().values() if not k.description]


# ---- the validator's keys (pydantic models) and the comments on their fields ---------------------------


def _assignment_comments(lines: list[str], pattern: str, sep: str) -> dict[str, str]:
    """{name: its comment} for each line matching `pattern` (group 1 is the name): the comment after
    `sep` on that line, else the comment lines right above it."""
    out: dict[str, str] = {}
    pending: list[str] = []
    for line in lines:
        text = line.strip()
        if text.startswith("#"):
            pending.append(text.lstrip("#").strip())
            continue
        m = re.match(pattern, line)
        if m:
            out[m[1]] = _split_comment(line.split(sep, 1)[1])[1] or " ".join(pending)
        pending = []
    return out


def _source_comments(cls: type) -> dict[str, str]:
    """{field: its comment} from a class's source."""
    return _assignment_comments(inspect.getsource(cls).splitlines()[1:], r"^\s{4}([a-z_][a-z0-9_]*)\s*:", ":")


def _default(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    if field.default is PydanticUndefined:
        return "required"
    d = field.default
    if hasattr(d, "model_dump"):
        return ""
    return "null" if d is None else str(d).lower() if isinstance(d, bool) else str(d)


def model_fields(cls: type, prefix: str) -> list[tuple[str, str, str]]:
    """(key, default, description) of a pydantic model's fields, its sub-models' flattened."""
    from pydantic import BaseModel

    comments = _source_comments(cls)
    out = []
    for name, field in cls.model_fields.items():  # type: ignore[attr-defined]
        key = f"{prefix}{field.alias or name}"
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += model_fields(ann, f"{key}.")
            continue
        out.append((key, _default(field), field.description or comments.get(name, "")))
    return out


def validator_keys() -> list[tuple[str, str, str]]:
    """Every key the config validator accepts, as a user writes it."""
    from ncp_local import config

    keys = []
    for key, default, desc in model_fields(config.RunConfig, ""):
        if key.split(".")[0] in ROLES:
            if not key.startswith("narrator."):
                continue
            key = "<role>" + key[len("narrator") :]
        keys.append((key, default, desc))
    for cls in (config.VLLMEngineCfg, config.ScriptedEngineCfg, config.OpenAIEngineCfg):
        keys += [(k, d, t) for k, d, t in model_fields(cls, "engine.") if k != "engine.name"]
    return keys


# ---- the sections -----------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    """Text for a table cell: Markdown's specials escaped outside `code` spans (a comment's `<run dir>`
    is not an HTML tag, its `*` no emphasis), pipes everywhere."""
    parts = text.replace("\n", " ").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*").replace("_", "\\_")
    return "`".join(parts).replace("|", "\\|")


def uncell(text: str) -> str:
    """A generated table cell's text as the code holds it (the reverse of `_cell`)."""
    for escaped, raw in (("\\|", "|"), ("\\*", "*"), ("\\_", "_"), ("&lt;", "<"), ("&gt;", ">")):
        text = text.replace(escaped, raw)
    return text


def _code(value: str) -> str:
    return f"`{value}`" if value else ""


def gen_config() -> str:
    keys = documented()
    missing = undocumented()
    if missing:
        raise ValueError(
            "conf/ keys with no description (add a comment beside or above each): "
            + ", ".join(f"{k.path} ({k.file})" for k in missing)
        )
    parts = [
        "## Keys set by conf/",
        "",
        (
            "Every key a file under `conf/` sets, with the value it has by default (the file that sets it: "
            "`config.yaml`, or the group's default option) and the comment the file gives it. "
            "`<role>` is `narrator`, `player` or `auditor`."
        ),
        "",
    ]
    sections: dict[str, list[Key]] = {}
    for k in keys.values():
        top = k.path.split(".")[0]
        section = (
            "`<role>.model` (conf/model/)"
            if k.path.startswith("<role>.model.")
            else "`<role>` (conf/narrator/, conf/player/, conf/auditor/, config.yaml)"
            if top == "<role>"
            else f"`{top}` (conf/{top}/)"
            if top in GROUPS
            else "top level and mode sections (config.yaml)"
        )
        sections.setdefault(section, []).append(k)
    for title in sorted(sections, key=lambda t: (not t.startswith("top"), t)):
        parts += [f"### {title}", "", "| key | default | set in | what it does |", "| --- | --- | --- | --- |"]
        for k in sections[title]:
            parts.append(
                f"| `{k.path}` | {_cell(_code(k.value))} | {k.file.removeprefix('conf/')} | {_cell(k.description)} |"
            )
        parts.append("")
    parts += [
        "## Options of each group",
        "",
        (
            "`GROUP=OPTION` on the command line picks `conf/GROUP/OPTION.yaml` (`model@<role>.model=OPTION` "
            "for a model file). The description is the file's opening comment."
        ),
        "",
    ]
    for group in [*GROUPS, *PRESET_GROUPS]:
        default = GROUPS.get(group, ("", ""))[1]
        parts += [f"### `{group}`", "", "| option | what it is |", "| --- | --- |"]
        for path in sorted((CONF / group).glob("*.yaml")):
            about = header(path)
            if not about and group in ROLES:
                model = re.search(r"/model@model: (\S+)", path.read_text(encoding="utf-8"))
                about = f"the model file `{model[1]}`" if model else ""
            mark = " (default)" if path.stem == default else ""
            parts.append(f"| `{path.stem}`{mark} | {_cell(about)} |")
        parts.append("")
    extra = [(k, d, t) for k, d, t in validator_keys() if k not in keys and not k.startswith("hydra")]
    parts += [
        "## Keys no file sets",
        "",
        (
            "The validator (`ncp_local/config/`, `ncp_local/engines/settings.py`, "
            "`ncp_local/protocol/stages/_base.py` `Bounds`) also accepts these; give them on the command line "
            "(`+key=value` when no file sets them) or in a file of your own. Unknown keys are refused."
        ),
        "",
        "| key | default | what it does |",
        "| --- | --- | --- |",
    ]
    parts += [f"| `{k}` | `{d}` | {_cell(t)} |" for k, d, t in extra]
    return "\n".join(parts) + "\n"


def gen_modes() -> str:
    from ncp_local.modes import MODES

    rows = ["| mode | what it does |", "| --- | --- |"]
    rows += [f"| `{m.name}` | {_cell(m.help)} |" for m in MODES]
    return "\n".join(rows) + "\n"


def exit_codes() -> list[tuple[str, str, str]]:
    """(code, constant, comment) from ncp_local/exits.py, in code order."""
    from ncp_local import exits

    source = Path(exits.__file__).read_text(encoding="utf-8")
    comments = _assignment_comments(source.splitlines(), r"^(EXIT_[A-Z_]+) = ", "=")
    rows = []
    for name, value in vars(exits).items():
        if name.startswith("EXIT_") and isinstance(value, int):
            rows.append((str(value), name, comments.get(name, "")))
    for signal, code in exits.EXIT_SIGNAL.items():
        rows.append((str(code), f"EXIT_SIGNAL[{signal!r}]", f"stopped by {signal}: " + comments.get("EXIT_SIGNAL", "")))
    return sorted(rows, key=lambda r: int(r[0]))


def gen_exits() -> str:
    rows = ["| code | constant | meaning |", "| ---: | --- | --- |"]
    rows += [f"| {c} | `{n}` | {_cell(t)} |" for c, n, t in exit_codes()]
    return "\n".join(rows) + "\n"


def gen_columns() -> str:
    from ncp_local.report.glossary import GLOSSARY

    return (
        "\n".join(["| column | meaning |", "| --- | --- |", *(f"| `{c}` | {_cell(t)} |" for c, t in GLOSSARY)]) + "\n"
    )


def gen_cost_columns() -> str:
    from ncp_local.report.glossary import COST_GLOSSARY

    return (
        "\n".join(["| column | meaning |", "| --- | --- |", *(f"| {c} | {_cell(t)} |" for c, t in COST_GLOSSARY)])
        + "\n"
    )


def gen_endings_columns() -> str:
    from ncp_local.report.glossary import ENDINGS_GLOSSARY

    return (
        "\n".join(["| column | meaning |", "| --- | --- |", *(f"| `{c}` | {_cell(t)} |" for c, t in ENDINGS_GLOSSARY)])
        + "\n"
    )


def gen_tables() -> str:
    """The analysis tables (ncp_local/report/table_schema.py): each table's version, row and columns."""
    from ncp_local.report.table_schema import TABLES

    parts = []
    for t in TABLES.values():
        parts += [
            f"### `{t.name}` (schema version {t.version})",
            "",
            f"One row: {t.row}.",
            "",
            "| column | type | what it holds |",
            "| --- | --- | --- |",
            *(f"| `{c.name}` | `{c.type}` | {_cell(c.doc)} |" for c in t.columns),
            "",
        ]
    return "\n".join(parts)


def gen_trials_columns() -> str:
    from ncp_local.report.glossary import TRIALS_GLOSSARY

    return (
        "\n".join(["| column | meaning |", "| --- | --- |", *(f"| `{c}` | {_cell(t)} |" for c, t in TRIALS_GLOSSARY)])
        + "\n"
    )


def _type(ann: Any) -> str:
    text = getattr(ann, "__name__", None) if isinstance(ann, type) else None
    text = text or str(ann).replace("typing.", "")
    return re.sub(r"\b(?:ncp_local|pydantic)\.[\w.]*\.(\w+)", r"\1", text)


def record_table(cls: type) -> str:
    comments = _source_comments(cls)
    rows = ["| field | type | default | what it holds |", "| --- | --- | --- | --- |"]
    for name, field in cls.model_fields.items():  # type: ignore[attr-defined]
        rows.append(
            f"| `{name}` | `{_cell(_type(field.annotation))}` | {_cell(_code(_default(field)))} | "
            f"{_cell(field.description or comments.get(name, ''))} |"
        )
    return "\n".join(rows)


def record_models() -> list[tuple[str, type]]:
    """(where the record lives in a run directory, its model), as the readers load them."""
    from ncp_local.bench.figures import (
        BenchFigures,
        Machine,
        WayFigures,
        Workload,
    )
    from ncp_local.protocol.reaudit import ReauditResult, TurnAudit
    from ncp_local.protocol.records import (
        Checkpoint,
        ConflictCheckRecord,
        ConflictCounts,
        ConflictRecord,
        DoubleCheckRecord,
        EpisodeResult,
        FactUpdateRecord,
        ModeRecord,
        OccurrenceRecord,
        StatusRecord,
        TrajectoryRecord,
        TurnRecord,
    )
    from ncp_local.rundir.call_log import CallLine
    from ncp_local.rundir.layout import ManifestShape
    from ncp_local.rundir.sweep_index import EngineRow, PointRow, SweepIndex

    return [
        ("results/<spec>.json", EpisodeResult),
        ("results/<spec>.json: each of `turns`", TurnRecord),
        ("`opening_update` and each turn's `fact_update`", FactUpdateRecord),
        ("each turn's `conflict_check`", ConflictCheckRecord),
        ("each turn's `double_check` (null when the first check found none)", DoubleCheckRecord),
        ("each of `conflicts` (a turn's standing ones, and each check's)", ConflictRecord),
        ("each check's `counts`", ConflictCounts),
        ("each turn's `failure_modes` (audit.failure_modes), one per standing conflict", ModeRecord),
        ("each turn's `trajectory_check`", TrajectoryRecord),
        ("`trajectory_check`'s `trigger` and `delta`", OccurrenceRecord),
        ("each of a turn's `status_check`", StatusRecord),
        ("checkpoints/<spec>.json", Checkpoint),
        ("a re-audit's results/<spec>.json", ReauditResult),
        ("each of a re-audit's `turns`", TurnAudit),
        ("manifest.json (the parts readers check; other keys are free)", ManifestShape),
        ("each line of calls.jsonl (a key is left out when its attempt did not have it)", CallLine),
        ("a sweep folder's index.json (index-shard-K-of-N.json per array task of a sharded sweep)", SweepIndex),
        ("each of a sweep index's `points`", PointRow),
        ("each of a sweep index's `engines` (batched launcher)", EngineRow),
        ("bench.json (mode=bench)", BenchFigures),
        ("bench.json: `machine`", Machine),
        ("bench.json: `workload`", Workload),
        ("bench.json: each of `ways`", WayFigures),
    ]


def gen_records() -> str:
    parts = []
    for where, cls in record_models():
        doc = inspect.getdoc(cls) or ""
        doc = "" if doc.startswith(("Usage docs", "!!!")) else doc.split("\n\n")[0].replace("\n", " ")
        parts += [f"### `{cls.__name__}`", "", f"{where}. {doc}".strip(), "", record_table(cls), ""]
    return "\n".join(parts)


def gen_everyday() -> str:
    """The README's everyday commands (its text up to the end of its code block): one list, kept in the README,
    shown on the site's first-run page."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Everyday commands\n", 1)[1]
    fence = section.index("```")
    return section[: section.index("```", fence + 3) + 3].strip() + "\n"


SECTIONS: dict[str, Callable[[], str]] = {
    "config": gen_config,
    "modes": gen_modes,
    "exits": gen_exits,
    "columns": gen_columns,
    "cost-columns": gen_cost_columns,
    "endings-columns": gen_endings_columns,
    "trials-columns": gen_trials_columns,
    "records": gen_records,
    "tables": gen_tables,
    "everyday": gen_everyday,
}


def generate(name: str) -> str:
    if name not in SECTIONS:
        raise KeyError(f"unknown generated section {name!r} (known: {', '.join(SECTIONS)})")
    return SECTIONS[name]()


def expand(markdown: str, where: str = "page") -> str:
    """A page with each `<!-- gen:NAME -->` line replaced by its section."""

    def one(m: re.Match[str]) -> str:
        try:
            return generate(m[1]).rstrip("\n")
        except KeyError as exc:
            raise ValueError(f"{where}: {exc.args[0]}") from None

    return MARKER.sub(one, markdown)


def changelog() -> str:
    """CHANGELOG.md for the site: its headings one level down under the page's own title."""
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    return text


# ---- the site's pages --------------------------------------------------------------------------------------

DOCS = ROOT / "docs"
SITE_SOURCES = ROOT / "build" / "docs"  # mkdocs.yml's docs_dir


def write_site(out: Path, docs: Path = DOCS) -> int:
    """docs/ copied into `out` (emptied first) with every page's sections generated and changelog.md the
    root CHANGELOG.md; the number of pages that had a section. A page naming an unknown section fails
    (ValueError, naming the page) before anything is written."""
    pages = {p.relative_to(docs): p.read_text(encoding="utf-8") for p in docs.rglob("*.md")}
    expanded = {rel: expand(text, str(rel)) for rel, text in pages.items()}
    expanded[Path("changelog.md")] = changelog()
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(docs, out, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, text in expanded.items():
        (out / rel).write_text(text, encoding="utf-8")
    return sum(1 for rel, text in pages.items() if MARKER.search(text))


# ---- command line ----------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    if argv[:1] == ["--site"]:
        out = Path(argv[1]) if len(argv) > 1 else SITE_SOURCES
        try:
            n = write_site(out)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"{out}: docs/ with the generated sections of {n} pages and the changelog")
        return 0
    if argv == ["--check"]:
        missing = undocumented()
        for k in missing:
            print(f"{k.file}: {k.path}: no description (a comment beside the key or right above it)")
        return 1 if missing else 0
    if not argv:
        print("\n".join(SECTIONS))
        return 0
    for name in argv:
        print(generate(name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
