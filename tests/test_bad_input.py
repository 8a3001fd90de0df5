"""Bad input of every class (issue 15) meets the contract: a documented exit
code, one line on stderr naming the file or key and what is wrong, no
traceback, and nothing under the working folder written, changed or lost.

Each case runs in a folder holding a finished run (`run/`), a one-spec
dataset (`data/`) and a copy of the rig's prompts (`pack/`); the command
points at all three, so a bad input that slipped through would resume the
finished run (exit 0) or refuse it as another config (the needle check then
fails), never pass unnoticed. Most cases call run.py's own entry functions in
this process (a process per case costs ~2 s of imports, ~20x the check
itself); what only a real process shows (signals, start-up) runs one.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cli_runner import submit_module
from ncp_local import config as config_mod
from ncp_local.exits import EXIT_BAD_INPUT, EXIT_SWEEP_FAILED, EXIT_SYSTEMATIC
from ncp_local.launch import cli

ROOT = Path(__file__).resolve().parent.parent
SPEC_ID = "red_riding_hood"
BASE = (
    "engine=scripted",
    "limit=1",
    "max_turns=1",
    "progress=false",
    "dataset.path={tmp}/data",
    "prompts.dir={tmp}/pack",
    "out_dir={tmp}/run",
)


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]  # after BASE (a key given here replaces BASE's); "{tmp}" is the case's folder
    expect: tuple[str, ...]  # all in the one stderr line: the file or key, and what is wrong
    code: int = 2
    setup: Callable[[Path], None] | None = None  # writes the bad input (before the snapshot)
    tool: str = "run"  # "run": run.py; "submit": slurm/submit.py
    whole: bool = False  # args are the whole command line (always so for submit)
    env: dict[str, str] = field(default_factory=dict)
    hide: tuple[str, ...] = ()  # packages made unimportable for the case


def _write(rel: str, text: str | bytes) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8")

    return setup


def _edit(rel: str, change: Callable[[str], str]) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        path = tmp / rel
        path.write_text(change(path.read_text(encoding="utf-8")), encoding="utf-8")

    return setup


def _unfinished(tmp: Path) -> None:
    # The finished run's results removed: a run directory with no finished episode.
    for f in (tmp / "run" / "results").glob("*.json"):
        f.unlink()


def _manifest_edit(run: Path, **fields: object) -> None:
    path = run / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text(encoding="utf-8")), **fields}), encoding="utf-8")


def _other_dataset(tmp: Path) -> None:
    """A copy of the finished run that says it played another text of its story (another dataset)."""
    shutil.copytree(tmp / "run", tmp / "other")
    m = json.loads((tmp / "other" / "manifest.json").read_text(encoding="utf-8"))
    m["dataset"] = {**m["dataset"], "sha256": "0" * 64, "files": {f"specs/{SPEC_ID}.yaml": "1" * 64}}
    (tmp / "other" / "manifest.json").write_text(json.dumps(m), encoding="utf-8")


def _sources(tmp: Path) -> None:
    # The first synopsis of specs/sources.yaml: a build that ran would call a model for it.
    text = (ROOT / "specs" / "sources.yaml").read_text(encoding="utf-8")
    (tmp / "sources.yaml").write_text(text, encoding="utf-8")


def _shard_without_specs(tmp: Path) -> None:
    # A sharded run of one shard whose manifest lost the dataset's spec list (hand-edited).
    shard = tmp / "sharded" / "shard-000-of-001"
    shutil.copytree(tmp / "run", shard)
    m = json.loads((shard / "manifest.json").read_text(encoding="utf-8"))
    del m["dataset"]["specs"]
    (shard / "manifest.json").write_text(json.dumps(m), encoding="utf-8")


SPEC = f"data/specs/{SPEC_ID}.yaml"
BOMB = (
    "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    + "".join(f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    + "specs: *i\n"
)

CASES = [
    # -- YAML attacks (spec files and the index) --------------------------------
    Case(
        "yaml-duplicate-key",
        (),
        (SPEC, "line ", "duplicate key 'meta'"),
        setup=_edit(SPEC, lambda t: t + "meta: {id: x, title: x, genres: [a], player_role: x}\n"),
    ),
    Case("yaml-alias-bomb-index", (), ("index.yaml", "anchors and aliases"), setup=_write("data/index.yaml", BOMB)),
    Case(
        "yaml-alias-in-field",
        (),
        (SPEC, "anchors and aliases"),
        setup=_edit(SPEC, lambda t: t.replace("synopsis: ", "synopsis: &s ", 1) + "x: *s\n"),
    ),
    Case(
        "yaml-deep-nesting",
        (),
        (SPEC, "nested deeper than 32 levels"),
        setup=_edit(SPEC, lambda t: t + "deep: " + "[" * 100 + "]" * 100 + "\n"),
    ),
    Case(  # past libyaml's own bound, which its parser meets before the rig's composer
        "yaml-deeper-than-libyaml",
        (),
        (SPEC, ": line ", "invalid YAML: exceeded maximum nesting depth"),
        setup=_edit(SPEC, lambda t: t + "deep: " + "[" * 5000 + "]" * 5000 + "\n"),
    ),
    Case(
        "yaml-long-id",
        (),
        ("index.yaml", "specs[0]", "not a plain spec id", "..."),
        setup=_write("data/index.yaml", f"specs: [{'a' * 300}]\n"),
    ),
    Case(
        "yaml-newline-in-id",
        (),
        (SPEC, "initial_facts[0].id", "not a plain id"),
        setup=_edit(SPEC, lambda t: t.replace("  - id: f_0\n", '  - id: "f\\n0"\n', 1)),
    ),
    Case(
        "yaml-huge-value-not-echoed",
        (),
        (SPEC, "commitments[0].type", "is not one of", "..."),
        setup=_edit(SPEC, lambda t: t.replace("type: ", f"type: {'x' * 200_000} #", 1)),
    ),
    Case(
        "yaml-python-tag",
        (),
        (SPEC, "invalid YAML", "python/object"),
        setup=_edit(
            SPEC, lambda t: t.replace("synopsis: ", 'synopsis: !!python/object/apply:os.system ["touch pwned"] #', 1)
        ),
    ),
    Case("yaml-binary-spec", (), (SPEC, "cannot read"), setup=_write(SPEC, b"\xff\xfe\x00garbage")),
    # -- prompt packs (checked at load: ncp_local/protocol/prompts.py) ----------------------
    Case(
        "pack-missing-template",
        (),
        ("pack", "missing template", "narrate.txt"),
        setup=lambda tmp: (tmp / "pack" / "narrate.txt").unlink(),
    ),
    Case(
        "pack-misspelt-placeholder",
        (),
        ("narrate.txt", "{factz}"),
        setup=_edit("pack/narrate.txt", lambda t: t + "\n{factz}\n"),
    ),
    Case(
        "pack-placeholder-stage-lacks",
        (),
        ("narrate.txt", "{synopsis}", "not provided to the narrate stage"),
        setup=_edit("pack/narrate.txt", lambda t: t + "\n{synopsis}\n"),
    ),
    Case("pack-empty-template", (), ("opening.txt", "empty template"), setup=_write("pack/opening.txt", "  \n")),
    Case(
        "pack-binary-template", (), ("opening.txt", "not UTF-8"), setup=_write("pack/opening.txt", b"\x89PNG\xff\x00")
    ),
    # -- overrides Hydra refuses (its several lines made one) ---------------------------
    Case("override-unknown-group-option", ("auditor=nope",), ("auditor: unknown option 'nope'", "qwen3_32b")),
    Case("override-unknown-key", ("foo=1",), ("foo: unknown key", "configuration.md")),
    # A near miss gets the closest real key, option or mode, from the config's own lists, never Hydra's
    # `+key` advice (which adds a key nothing reads).
    Case("override-misspelt-key", ("max_turn=4",), ("max_turn: unknown key (did you mean max_turns?)",)),
    Case(
        "override-misspelt-nested-key",
        ("narrator.temprature=0.2",),
        ("narrator.temprature: unknown key (did you mean narrator.temperature?)",),
    ),
    Case(
        "override-misspelt-group-key",  # a key only the chosen group has (engine=scripted's, from BASE)
        ("engine.conflict_rat=0",),
        ("engine.conflict_rat: unknown key (did you mean engine.conflict_rate?)",),
    ),
    Case(
        "override-misspelt-group-option",
        ("auditor=qwen332b",),
        ("auditor: unknown option 'qwen332b' (did you mean qwen3_32b?)",),
    ),
    Case("override-misspelt-mode", ("mode=reprot",), ("mode: unknown mode 'reprot' (did you mean report?)",)),
    Case(
        "override-misspelt-key-in-sweep",
        ("-m", "max_turn=3,4"),
        ("max_turn: unknown key (did you mean max_turns?)",),
    ),
    # The official method's package not installed: which package, and the command that installs it.
    Case(
        "method-official-not-installed",
        ("method=official_baseline",),
        (
            "method.name",
            "official package 'ncpbench_reference_baseline' is not installed",
            "pip install -e /path/to/NCP-Bench -e /path/to/NCP-Bench/reference-methods/baseline",
        ),
        hide=("ncpbench_reference_baseline", "ncpbench"),
    ),
    Case("override-unparsable", ("max_turns=[",), ("max_turns", "no viable alternative")),
    Case("override-sweep-without-multirun", ("auditor=qwen3,smollm2",), ("--multirun",)),
    Case("override-sweep-unknown-option", ("-m", "auditor=smollm2,nope"), ("auditor: unknown option 'nope'",)),
    Case(
        "override-multirun-and-cfg", ("-m", "--cfg", "job", *BASE, "max_turns=1,2"), ("--multirun", "--cfg"), whole=True
    ),
    Case("override-out-of-range", ("max_turns=0",), ("max_turns", "greater than or equal to 1")),
    Case("override-huge-unparsable", ("max_turns=[" + "a" * 20_000,), ("max_turns", "...")),
    Case("override-huge-key", (f"+narrator.{'k' * 20_000}=1",), ("config override", "kkk", "...")),
    # -- config sections: typed, strict, closed ------------------------------------
    Case("cfg-max-turns-bool", ("max_turns=true",), ("max_turns", "valid integer")),
    Case("cfg-progress-int", ("progress=1",), ("progress", "valid boolean")),
    Case(
        "cfg-misspelt-role-key",
        ("+narrator.temprature=0.1",),
        ("narrator.temprature: unknown key (did you mean narrator.temperature?)",),
    ),
    Case("cfg-unknown-engine-key", ("+engine.bogus=1",), ("engine.bogus: unknown key (every key:",)),
    Case("cfg-delay-not-number", ("engine.delay_s=abc",), ("engine.delay_s", "valid number")),
    Case("cfg-delay-negative", ("engine.delay_s=-1",), ("engine.delay_s", "greater than or equal to 0")),
    Case("cfg-rate-not-number", ("engine.conflict_rate=abc",), ("engine.conflict_rate", "valid number")),
    Case("cfg-rate-above-one", ("engine.node_rate=1.5",), ("engine.node_rate", "less than or equal to 1")),
    Case("cfg-die-after-bool", ("engine.die_after_calls=true",), ("engine.die_after_calls", "valid integer")),
    Case(
        "cfg-context-limit-turn-0",
        ("engine=scripted", "engine.context_limit_turn=0"),
        ("engine.context_limit_turn", "greater than or equal to 1"),
    ),
    Case("cfg-openai-timeout", ("engine=openai", "+engine.timeout_s=-1"), ("engine.timeout_s", "greater than 0")),
    Case("cfg-condition-key", ("+condition.level=3",), ("condition", "unknown key 'level'")),
    # Trials (issue 37): the count, the roles that vary, and the spelling Hydra would otherwise take.
    Case("trials-count-zero", ("trials.count=0",), ("trials.count", "greater than or equal to 1")),
    Case("trials-count-negative", ("trials.count=-1",), ("trials.count", "greater than or equal to 1")),
    Case("trials-vary-unknown-role", ("trials.vary=[nobody]",), ("trials.vary", "'nobody' is not a role")),
    Case("trials-vary-word", ("trials.vary=some",), ("trials.vary", "'some' is neither 'all'")),
    Case("trials-vary-twice", ("trials.vary=[player,player]",), ("trials.vary", "names a role twice")),
    Case("trials-as-number", ("trials=4",), ("trials", "set trials.count=N")),
    # -- method options (the narrator's Options; plugin narrators checked first) ----
    Case("method-budget-not-int", ("method=hiagent", "method.budget_tokens=abc"), ("method.budget_tokens",)),
    Case("method-budget-negative", ("method=hiagent", "method.budget_tokens=-5"), ("method.budget_tokens",)),
    Case("method-unknown-key", ("+method.histroy=full",), ("method.histroy",)),
    Case("method-not-a-narrator", ("method.name=collections:OrderedDict",), ("method.name", "not a narrator")),
    Case("method-not-importable", ("method.name=no_such_pkg.mod:Cls",), ("method.name", "cannot import")),
    Case(
        "cmdline-option-after-overrides",
        (*BASE[:3], "--multirun", *BASE[3:], "seed=1,2"),
        ("command line", "unrecognized arguments"),
        whole=True,
    ),
    # -- engines, dependencies and model paths (before the run directory exists) ----
    Case(
        "engine-vllm-not-installed",
        ("engine=vllm",),
        ("engine", "vllm package", "make install", "pip install -e '.[cpu]'"),
        hide=("vllm",),
    ),
    # vLLM present but not importable: the engine and its install command, not the grammar check's package.
    Case(
        "engine-vllm-not-importable",
        ("engine=vllm",),
        ("engine=vllm", "not importable", "torch", "make install", "pip install -e '.[cpu]'"),
        hide=("torch",),
    ),
    # Both missing: the line is about the engine (the grammar package comes with it), not xgrammar.
    Case(
        "engine-vllm-and-grammar-package-missing",
        ("engine=vllm",),
        ("engine=vllm needs the vllm package", "make install"),
        hide=("vllm", "xgrammar"),
    ),
    # The paper's preset lifts every output bound; the embedded 135M model would then write until
    # max_tokens (a run of hours per story that measures nothing): refused before anything starts.
    Case(
        "paper-preset-on-the-embedded-model",
        ("engine=vllm", "experiment=paper"),
        ("narrator.bounds", "embedded 135M model", "experiment=paper", "narrator.model="),
    ),
    Case(
        "engine-vllm-grammar-package-missing",
        ("engine=vllm",),
        ("engine=vllm", "not importable", "xgrammar", "make install"),
        hide=("xgrammar",),
    ),
    Case("engine-name-unknown", ("engine.name=foo",), ("engine.name", "'foo'", "vllm, scripted, openai")),
    Case(
        "engine-openai-not-installed", ("engine=openai",), ("engine", "openai package", "pip install"), hide=("openai",)
    ),
    Case(
        "engine-openai-key-unset",
        ("engine=openai", "+engine.api_key_env=NCP_TEST_UNSET_KEY"),
        ("engine.api_key_env", "NCP_TEST_UNSET_KEY", "not set"),
    ),
    Case(
        "model-path-plain-file",
        ("engine=vllm", "narrator.model.path={tmp}/model.bin"),
        ("narrator.model.path", "is a file"),
        setup=_write("model.bin", b"\0" * 64),
    ),
    Case(
        "model-path-empty-folder",
        ("engine=vllm", "narrator.model.path={tmp}/model"),
        ("narrator.model.path", "empty folder"),
        setup=lambda tmp: (tmp / "model").mkdir(),
    ),
    # -- out_dir --------------------------------------------------------------------
    Case(
        "out-dir-is-a-file",
        ("out_dir={tmp}/afile",),
        ("afile", "out_dir", "not a directory"),
        setup=_write("afile", "x\n"),
    ),
    Case("out-dir-read-only", ("out_dir=/proc/self/ncp-run",), ("ncp-run", "out_dir", "cannot be written")),
    Case(
        "out-dir-under-a-file",
        ("out_dir={tmp}/afile/run",),
        ("afile", "out_dir", "is a file"),
        setup=_write("afile", "x\n"),
    ),
    Case(
        "report-out-is-a-file",
        ("mode=report", "runs=[{tmp}/run]", "report.out={tmp}/afile"),
        ("afile", "report.out", "not a directory"),
        setup=_write("afile", "x\n"),
    ),
    Case(
        "report-gpu-hour-cost-negative",
        ("mode=report", "runs=[{tmp}/run]", "report.gpu_hour_cost=-1"),
        ("report.gpu_hour_cost", "greater than or equal to 0"),
    ),
    Case(
        "compare-one-run",
        ("mode=compare", "runs=[{tmp}/run]"),
        ("runs", "give two runs or more to compare"),
    ),
    Case(
        "compare-runs-on-different-datasets",
        ("mode=compare", "runs=[{tmp}/run,{tmp}/other]"),
        ("runs", "they ran on different datasets", "nothing to compare"),
        setup=lambda tmp: _other_dataset(tmp),
    ),
    Case(
        "compare-unknown-paper-row",
        ("mode=compare", "runs=[{tmp}/run]", "compare.paper=table9/GPT-9"),
        ("compare.paper", "no paper row 'table9/GPT-9'", "table1/GPT-4o-mini"),
    ),
    Case(
        "export-out-is-a-file",
        ("mode=export", "runs=[{tmp}/run]", "export.out={tmp}/afile"),
        ("afile", "export.out", "not a directory"),
        setup=_write("afile", "x\n"),
    ),
    Case(
        "export-format-unknown", ("mode=export", "runs=[{tmp}/run]", "export.format=csv"), ("export.format", "inspect")
    ),
    Case(
        "export-inspect-not-installed",
        ("mode=export", "runs=[{tmp}/run]"),
        ("export.format", "inspect_ai", "not installed", "pip install -e '.[inspect]'"),
        hide=("inspect_ai", "inspect_ai.event", "inspect_ai.log", "inspect_ai.model", "inspect_ai.scorer"),
    ),
    # -- run-directory parts of the wrong kind (ncp_local/rundir/places.py check_place) ----
    Case(
        "rundir-checkpoints-a-file",
        (),
        ("run/checkpoints", "a file where the run keeps a folder", "move it away"),
        setup=lambda tmp: (shutil.rmtree(tmp / "run" / "checkpoints"), _write("run/checkpoints", "x\n")(tmp)),
    ),
    Case(
        "rundir-results-a-file",
        (),
        ("run/results", "a file where the run keeps a folder"),
        setup=lambda tmp: (shutil.rmtree(tmp / "run" / "results"), _write("run/results", "x\n")(tmp)),
    ),
    Case(
        "rundir-lock-a-directory",
        (),
        ("run/.lock", "a folder where the run keeps a file"),
        setup=lambda tmp: _dir_instead("run/.lock")(tmp),
    ),
    # -- hand-edited files of the wrong shape -----------------------------------------
    Case(
        "report-manifest-config-a-string",
        ("mode=report", "runs=[{tmp}/run]"),
        ("run/manifest.json", "config", "dictionary"),
        setup=lambda tmp: _manifest_edit(tmp / "run", config="x"),
    ),
    Case(
        "build-index-a-list",
        ("mode=build", "sources={tmp}/sources.yaml", "out={tmp}/built"),
        ("built/index.yaml", "not a dataset index"),
        setup=lambda tmp: (_sources(tmp), _write("built/index.yaml", "- a\n- b\n")(tmp)),
    ),
    Case(
        "build-spec-target-a-folder",
        ("mode=build", "sources={tmp}/sources.yaml", "out={tmp}/built"),
        ("built/specs/red_riding_hood.yaml", "out", "a folder where the build writes this spec"),
        setup=lambda tmp: (_sources(tmp), (tmp / "built" / "specs" / "red_riding_hood.yaml").mkdir(parents=True)),
    ),
    Case(
        "build-out-a-file",
        ("mode=build", "sources={tmp}/sources.yaml", "out={tmp}/afile"),
        ("afile", "out", "not a directory"),
        setup=lambda tmp: (_sources(tmp), _write("afile", "x\n")(tmp)),
    ),
    Case(
        "merge-manifest-without-spec-list",
        ("mode=merge", "out_dir={tmp}/sharded"),
        ("shard-000-of-001/manifest.json", "dataset.specs", "missing"),
        setup=lambda tmp: _shard_without_specs(tmp),
    ),
    # A damaged result is left out of a re-audit only with the run's own re-run (exit 2, named): judging the
    # rest would give agreement over other episodes than the run's report and mark the re-audit DONE.
    Case(
        "reaudit-truncated-result",
        ("mode=reaudit", "runs=[{tmp}/run]", "out_dir={tmp}/ra"),
        (f"results/{SPEC_ID}.json", "not JSON", "left out of the re-audit", "re-run the source run"),
        setup=lambda tmp: _truncate(RESULT)(tmp),
    ),
    # -- a sweep whose points would share one run directory (run.py's point checker) ----
    Case(
        "sweep-points-share-out-dir",
        ("-m", "seed=1,2", "out_dir={tmp}/fixed"),
        ("fixed", "out_dir", "several sweep points", "seed=1", "seed=2"),
    ),
    # -- reports of a run with no finished episode ----------------------------------
    # (mode=report says a run with nothing yet has nothing to report, exit 0: tests/test_report_in_flight.py)
    Case(
        "review-no-finished-episode",
        ("mode=review", "runs=[{tmp}/run]"),
        ("run", "runs", "no finished episode"),
        setup=_unfinished,
    ),
    Case(
        "export-no-finished-episode",
        ("mode=export", "runs=[{tmp}/run]"),
        ("run", "runs", "no finished episode"),
        setup=_unfinished,
    ),
    # The re-audit loads the auditor alone: its missing model is named as the auditor's, not the narrator's.
    Case(
        "reaudit-auditor-model-missing",
        ("mode=reaudit", "runs=[{tmp}/run]", "out_dir={tmp}/ra", "engine=vllm", "auditor.model.path={tmp}/nomodel"),
        ("auditor.model.path", "no such path"),
    ),
    Case(
        "reaudit-no-finished-episode",
        ("mode=reaudit", "runs=[{tmp}/run]", "out_dir={tmp}/ra"),
        ("run", "runs", "no finished episode"),
        setup=_unfinished,
    ),
    # -- Slurm submit (no cluster needed: each fails before sbatch) --------------------
    Case(
        "submit-no-sbatch",
        ("--shards", "1", "--", *BASE),
        ("sbatch", "not found on PATH"),
        tool="submit",
        env={"PATH": "{tmp}/nobin"},
    ),
    Case(
        "submit-json-garbage",
        ("--shards", "1", "--dry-run", "--", *BASE),
        ("submit.json", "cannot read"),
        tool="submit",
        setup=_write("run/submit.json", "{not json"),
    ),
    Case(
        "submit-json-not-a-record",
        ("--shards", "1", "--dry-run", "--", *BASE),
        ("submit.json", "not a submit record"),
        tool="submit",
        setup=_write("run/submit.json", '{"identity": 1, "jobs": "x"}'),
    ),
    Case(
        "submit-parallel-zero",
        ("--shards", "1", "--parallel", "0", "--dry-run", "--", *BASE),
        ("--parallel",),
        tool="submit",
    ),
    Case(
        "submit-gpus-negative", ("--shards", "1", "--gpus", "-1", "--dry-run", "--", *BASE), ("--gpus",), tool="submit"
    ),
]


def _key(arg: str) -> str:
    return arg.split("=", 1)[0].lstrip("+~")


def _command(case: Case, tmp: Path) -> list[str]:
    if case.tool == "submit" or case.whole:
        args = list(case.args)
    else:
        given = {_key(a) for a in case.args if "=" in a}
        flags = [a for a in case.args if a.startswith("-")]  # Hydra's options come first
        args = flags + [a for a in BASE if _key(a) not in given] + [a for a in case.args if a not in flags]
    return [a.replace("{tmp}", str(tmp)) for a in args]


def snapshot(root: Path) -> dict[str, str]:
    """Every file (by content hash) and folder under root."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


def run_in_process(tool: str, argv: list[str]) -> tuple[int, str, str]:
    """run.py's (or submit.py's) entry point in this process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            if tool == "submit":
                code = submit_module().main(argv)
            else:
                if "-m" in argv or "--multirun" in argv:  # checked up front; 0: the sweep would start
                    problem = cli.check_overrides(argv)
                    if problem:
                        print(f"error: {config_mod.bounded(problem)}", file=sys.stderr)
                    code = EXIT_BAD_INPUT if problem else 0
                else:
                    code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # what the process would print: the test fails on it
            traceback.print_exc()
            code = 1
    return code, out.getvalue(), err.getvalue()


def assert_one_line(code: int, stdout: str, stderr: str, want_code: int, expect: tuple[str, ...]) -> str:
    assert "Traceback" not in stderr + stdout, stderr
    assert code == want_code, (code, stdout[-2000:], stderr[-2000:])
    line = stderr.strip()
    assert line.startswith("error: ") and "\n" not in line, stderr
    assert len(line) < 600, f"error line of {len(line)} characters: input echoed?"
    for needle in expect:
        assert needle in line, (needle, line)
    return line


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a one-spec dataset, the rig's prompts and a finished run of BASE on them."""
    tmp = tmp_path_factory.mktemp("finished")
    (tmp / "data" / "specs").mkdir(parents=True)
    shutil.copy(ROOT / "specs" / "specs" / f"{SPEC_ID}.yaml", tmp / "data" / "specs")
    (tmp / "data" / "index.yaml").write_text(f"specs: [{SPEC_ID}]\n")
    shutil.copytree(ROOT / "prompts", tmp / "pack")
    code, out, err = run_in_process("run", [a.replace("{tmp}", str(tmp)) for a in BASE])
    assert code == 0 and (tmp / "run" / "results" / f"{SPEC_ID}.json").is_file(), err
    return tmp


@pytest.fixture
def workspace(finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    tmp = tmp_path / "w"
    shutil.copytree(finished, tmp)
    monkeypatch.chdir(tmp)  # a default `runs/` would land here, inside the snapshot
    return tmp


# The cases whose check imports vLLM, transformers or a grammar backend (no engine starts).
ENGINE_LIBS_CASES = {
    "engine-vllm-not-importable",
    "engine-vllm-grammar-package-missing",
    "paper-preset-on-the-embedded-model",
    "model-path-plain-file",
    "model-path-empty-folder",
    "reaudit-auditor-model-missing",
}


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=pytest.mark.engine_libs) if c.id in ENGINE_LIBS_CASES else c for c in CASES],
    ids=[c.id for c in CASES],
)
def test_bad_input(case: Case, workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if case.setup:
        case.setup(workspace)
    for name, value in case.env.items():
        monkeypatch.setenv(name, value.replace("{tmp}", str(workspace)))
    for package in case.hide:
        monkeypatch.setitem(sys.modules, package, None)  # find_spec and import both see it as absent
    monkeypatch.delenv("NCP_TEST_UNSET_KEY", raising=False)
    before = snapshot(workspace)
    code, out, err = run_in_process(case.tool, _command(case, workspace))
    assert_one_line(code, out, err, case.code, case.expect)
    assert snapshot(workspace) == before, "the working folder changed"


def test_read_only_out_dir_with_no_usable_temporary_directory(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No temporary directory anywhere (tempfile's own error) and out_dir read-only: the one-line
    refusal of the out_dir, not a traceback from the quiet terminal's temporary log."""
    import errno
    import tempfile

    def nowhere() -> str:
        raise FileNotFoundError(errno.ENOENT, "No usable temporary directory found in ['/tmp']")

    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setattr(tempfile, "_get_default_tempdir", nowhere)
    with pytest.raises(FileNotFoundError):
        tempfile.mkstemp()  # as on such a machine
    before = snapshot(workspace)
    code, out, err = run_in_process(
        "run", [a.replace("{tmp}", str(workspace)) for a in BASE] + ["out_dir=/proc/self/ncp-run"]
    )
    assert_one_line(code, out, err, 2, ("ncp-run", "out_dir", "cannot be written"))
    assert snapshot(workspace) == before


# -- what only a real process shows ------------------------------------------------


def _popen(args: list[str], cwd: Path, **kw: object) -> subprocess.Popen[str]:
    # SIGINT back to its default even if this test runs in the background (a
    # shell starts background jobs with SIGINT ignored, which Python keeps).
    return subprocess.Popen(
        [sys.executable, str(ROOT / "run.py"), *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        **kw,
    )  # type: ignore[arg-type]


def test_same_contract_from_a_real_process(workspace: Path) -> None:
    """The in-process driver above is run.py's own path: one case through a process agrees."""
    case = next(c for c in CASES if c.id == "cfg-max-turns-bool")
    before = snapshot(workspace)
    proc = _popen(_command(case, workspace), workspace)
    out, err = proc.communicate(timeout=300)
    assert_one_line(proc.returncode, out, err, 2, case.expect)
    assert snapshot(workspace) == before


def test_sigint_during_start_up(workspace: Path) -> None:
    before = snapshot(workspace)
    proc = _popen(_command(Case("x", ("max_turns=2",), ()), workspace), workspace)
    time.sleep(0.5)  # importing hydra, pydantic and the rig takes longer than this
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert_one_line(proc.returncode, out, err, 130, ("stopped by SIGINT",))
    assert snapshot(workspace) == before


def test_sigint_during_reaudit(workspace: Path) -> None:
    before = snapshot(workspace / "run")
    ra = workspace / "ra"
    proc = _popen(
        _command(
            Case("x", ("mode=reaudit", "runs=[{tmp}/run]", "out_dir={tmp}/ra", "engine.delay_s=2"), ()), workspace
        ),
        workspace,
    )
    deadline = time.monotonic() + 120
    while not (ra / "calls.jsonl").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)  # the re-audit's directory is open and its first call in flight
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert_one_line(proc.returncode, out, err, 130, ("stopped by SIGINT",))
    assert snapshot(workspace / "run") == before, "the judged run changed"
    assert not list((ra / "results").glob("*.json")) and not (ra / "DONE").exists()


def test_sweep_with_a_failed_point_runs_the_rest(tmp_path: Path) -> None:
    """A local sweep runs every point even when one fails, then exits 6 naming it."""
    # One spec: one turn takes 8 calls, two take more than 10 (die_after_calls is not in the run identity).
    args = ["-m", "engine=scripted", "limit=1", "progress=false", "engine.die_after_calls=10", "max_turns=2,1"]
    proc = _popen(args, tmp_path)
    out, err = proc.communicate(timeout=300)
    assert "Traceback" not in out + err
    assert proc.returncode == EXIT_SWEEP_FAILED, (proc.returncode, err)
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: sweep: 1 of 2 point(s) failed: #0 (exit 3)"), err
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 2 and sum((r / "DONE").exists() for r in runs) == 1


@pytest.mark.parametrize(
    "args, refused",
    [
        (("max_turns=1,-1",), "max_turns=-1: config: max_turns"),
        (("seed=0", "method=hiagent", "method.budget_tokens=64,-5"), "method.budget_tokens=-5"),
        (("out_dir=runs/ok,/proc/ncp-run",), "/proc/ncp-run: out_dir: cannot be written"),
    ],
    ids=["bad-value", "bad-method-option", "bad-output-path"],
)
def test_sweep_point_refused_up_front_the_others_run(tmp_path: Path, args: tuple[str, ...], refused: str) -> None:
    """Every point is checked before the first starts; a refused one is named then, and the rest run."""
    proc = _popen(["-m", "engine=scripted", "limit=1", "progress=false", *args], tmp_path)
    out, err = proc.communicate(timeout=300)
    assert "Traceback" not in out + err
    assert proc.returncode == EXIT_SWEEP_FAILED, (proc.returncode, err)
    lines = err.strip().splitlines()
    assert refused in lines[0] and "the other points run" in lines[0], err  # before anything ran
    assert lines[-1].startswith("error: sweep: 1 of 2 point(s) failed: #1 (exit 2); fix the refused point(s)"), err
    # Said once: the refused point's job is not run to say it again; its index row keeps the line.
    assert [line for line in lines if line.startswith("error: ")] == [lines[0], lines[-1]], err
    (index,) = tmp_path.rglob("index.json")
    row = json.loads(index.read_text())["points"][1]
    assert (row["exit_code"], row["status"]) == (2, "failed") and row["error"] in lines[0]
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "DONE").exists()  # the refused point wrote nothing


# -- damaged run directories: recovered, not refused (ncp_local/rundir/store.py) ----------
# A damaged file is moved to quarantine/ with one warning line and its episode
# played again: exit 0, the run whole again, and the damaged bytes kept.


RESULT = f"run/results/{SPEC_ID}.json"


def _truncate(rel: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        path = tmp / rel
        path.write_bytes(path.read_bytes()[:40])

    return setup


def _dir_instead(rel: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        (tmp / rel).unlink()
        (tmp / rel).mkdir()

    return setup


RECOVER = [
    Case("store-truncated-result", (), (RESULT, "quarantine"), code=0, setup=_truncate(RESULT)),
    Case(
        "store-garbage-manifest",
        (),
        ("run/manifest.json", "quarantine"),
        code=0,
        setup=_write("run/manifest.json", "{garbage"),
    ),
    Case("store-directory-for-result", (), (RESULT, "quarantine"), code=0, setup=_dir_instead(RESULT)),
    Case(
        "store-garbage-checkpoint",
        (),
        (f"run/checkpoints/{SPEC_ID}.json", "quarantine"),
        code=0,
        setup=_write(f"run/checkpoints/{SPEC_ID}.json", b"\x00\xffnot json"),
    ),
]


@pytest.mark.parametrize("case", RECOVER, ids=[c.id for c in RECOVER])
def test_damaged_run_directory_recovers(case: Case, workspace: Path) -> None:
    assert case.setup
    case.setup(workspace)
    run = workspace / "run"
    before = snapshot(run)
    old = {rel: (run / rel).read_bytes() for rel in ("calls.jsonl", "manifest.json") if (run / rel).is_file()}
    code, out, err = run_in_process("run", _command(case, workspace))
    assert "Traceback" not in out + err, err
    assert code == 0, (code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: "), err
    for needle in case.expect:
        assert needle.removeprefix("run/") in lines[0], (needle, lines[0])
    assert (workspace / RESULT).is_file(), "the episode was not played again"
    after = snapshot(run)
    quarantined = {h for rel, h in after.items() if rel.startswith("quarantine")}
    for rel, digest in before.items():
        if digest == "dir" or after.get(rel) == digest or digest in quarantined:
            continue
        # Only appended to: the call log, and the manifest's list of resumes.
        new = (run / rel).read_bytes()
        if rel == "calls.jsonl":
            assert new.startswith(old[rel]), "calls.jsonl was rewritten, not appended to"
        elif rel == "manifest.json":
            was, now = json.loads(old[rel]), json.loads(new)
            assert now.pop("resumes")[: len(was["resumes"])] == was.pop("resumes") and now == was, rel
        elif rel == "status.json":
            assert json.loads(new)["state"] == "done", rel  # the heartbeat: rewritten by each process, never a result
        else:
            raise AssertionError(f"{rel} changed and its old bytes are not in quarantine/")


def test_call_log_line_not_utf8_is_skipped_as_a_torn_line(workspace: Path) -> None:
    """A call-log line with invalid UTF-8 (a torn write on a failing disk) costs that line, as a torn JSON
    line does: the log records attempts, no result depends on it, and it is only ever appended to."""
    log = workspace / "run" / "calls.jsonl"
    old = log.read_bytes() + b'{"spec_id": "x\xff\xfe", "stage": "narrate"}\n' + b"[1, 2]\n"
    log.write_bytes(old)
    (workspace / RESULT).unlink()  # the episode is played again, appending to the damaged log
    code, out, err = run_in_process("run", _command(Case("x", (), ()), workspace))
    assert "Traceback" not in out + err, err
    assert code == 0 and err == "", (code, err)
    assert log.read_bytes().startswith(old) and "calls: " in out


def _crlf_bom(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in (".yaml", ".txt"):
            text = path.read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
            path.write_bytes(b"\xef\xbb\xbf" + text)


def test_crlf_and_bom_give_the_results_of_lf(finished: Path, tmp_path: Path) -> None:
    """Specs, index and prompt pack saved on Windows (CRLF, a UTF-8 BOM) run as the same files with LF:
    the same identity and byte-identical results."""
    for name in ("data", "pack"):
        shutil.copytree(finished / name, tmp_path / name)
    _crlf_bom(tmp_path)
    assert (tmp_path / SPEC).read_bytes().startswith(b"\xef\xbb\xbf") and b"\r\n" in (tmp_path / SPEC).read_bytes()
    runs = {}
    for name, root in (("lf", finished), ("crlf", tmp_path)):
        args = [a.replace("{tmp}", str(root)) for a in BASE if not a.startswith("out_dir")]
        code, out, err = run_in_process("run", [*args, "max_turns=2", f"out_dir={tmp_path}/{name}"])
        assert code == 0, err
        runs[name] = snapshot(tmp_path / name / "results")
    assert runs["lf"] == runs["crlf"] and runs["lf"]


def test_a_run_that_measures_nothing_is_systematic(workspace: Path, window_fills: Callable[[], None]) -> None:
    """Every episode ends context_limit before its first committed turn (answers that fill the window:
    the fact update after the opening has no room left): exit 5, one line naming the cause and the fix."""
    window_fills()
    code, out, err = run_in_process("run", _command(Case("x", ("out_dir={tmp}/new",), ()), workspace))
    line = assert_one_line(
        code,
        out,
        err,
        EXIT_SYSTEMATIC,
        (
            "1 of 1 episodes",
            "context_limit before their first committed turn",
            "fill the model's window",
            "bounds",
            "larger window",
            "max_invalid_share",
        ),
    )
    assert "fact_update" in line


def test_batched_sweep_points_sharing_a_run_directory_are_refused(finished: Path, tmp_path: Path) -> None:
    """The batched launcher refuses them too, before any point starts (ncp_local/launch/sweep.py)."""
    args = [a.replace("{tmp}", str(finished)) for a in BASE if not a.startswith("out_dir")]
    proc = _popen(["-m", "hydra/launcher=batched", *args, "seed=1,2", f"out_dir={tmp_path}/fixed"], tmp_path)
    out, err = proc.communicate(timeout=300)
    assert_one_line(
        proc.returncode,
        out,
        err,
        EXIT_BAD_INPUT,
        ("fixed", "out_dir", "several sweep points", "seed=1", "seed=2", "none is started"),
    )
    assert not (tmp_path / "fixed").exists()
