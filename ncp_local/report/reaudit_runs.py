"""A re-audit directory read as a run for comparisons: the same transcripts, judged by another auditor.

`mode=compare runs=[RUN, REAUDIT]` asks Table 2's question: how much the figures move when only the
auditor changes. Per episode of the source run, the re-auditor's verdict (report/auditors.py's
`of_reaudit`): ended at its first standing conflict, with that turn's types; or, where it found none,
still going at the recorded length. A story the source auditor ended at turn n with a conflict the
re-auditor did not uphold is `overruled`, censored there (T > n: nothing was narrated after it), which
the curves take as they take the window's `context_limit` and a comparison names apart from it; an
episode that reached the turn cap or resolved everything ends as it did. Trajectory and satisfied shares
are the source's: a re-audit judges conflicts and facts, not the story's beats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..protocol.metrics import OVERRULED, EpisodeMetrics
from ..protocol.trials import episode_name
from ..rundir.layout import MANIFEST, read_manifest
from .auditors import of_reaudit
from .runs import REAUDIT_KIND, Run, expand_runs, load_run, load_runs


@dataclass
class ReauditRun(Run):
    """A re-audit's verdicts on its source run's episodes, as `Run.metrics()` gives a run's."""

    judged: list[EpisodeMetrics] = field(default_factory=list)
    cap: int = 0

    def metrics(self) -> list[EpisodeMetrics]:
        return list(self.judged)

    @property
    def max_turns(self) -> int:
        return self.cap


def is_reaudit(path: str | Path) -> bool:
    manifest = Path(path).expanduser() / MANIFEST
    return manifest.is_file() and read_manifest(manifest).get("kind") == REAUDIT_KIND


def reaudit_run(path: Path) -> ReauditRun:
    manifest = read_manifest(path / MANIFEST)
    source = load_run(str((manifest.get("source") or {}).get("path") or ""))
    auditor = of_reaudit(path, source)
    judged = []
    for m in source.metrics():
        verdict = auditor.episodes.get(episode_name(m.spec_id, m.trial))
        if m.termination == "invalid" or verdict is None:
            continue
        if verdict.types:
            termination = "conflict"
        else:  # what the re-audit does not judge stands; a conflict it let stand leaves the story censored
            termination = OVERRULED if m.termination == "conflict" else m.termination
        judged.append(
            EpisodeMetrics(
                m.spec_id,
                termination,
                verdict.turns,
                m.trajectory_progress,
                m.satisfied,
                "fact" in verdict.types,
                "commitment" in verdict.types,
                "player_input" in verdict.types,
                trial=m.trial,
            )
        )
    # The source's dataset and config, so stories pair with it and the setup reads as the source's.
    merged = {**source.manifest, **{k: v for k, v in manifest.items() if k not in ("dataset",)}}
    merged["dataset"] = source.manifest.get("dataset")
    label = f"re-audit by {auditor.label}"
    return ReauditRun(path, label, merged, {}, judged=judged, cap=source.max_turns)


def load_compared(paths: list[str], label: str | None = None) -> list[Run]:
    """Runs and re-audit directories in the order given (runs labelled as `load_runs` labels them)."""
    if not any(is_reaudit(p) for p in paths):
        return load_runs(paths, label)
    plain = [p for p in paths if not is_reaudit(p)]
    loaded = iter(load_runs(plain, label) if plain else [])
    out: list[Run] = []
    for p in paths:
        if is_reaudit(p):
            out.append(reaudit_run(Path(p).expanduser()))
        else:  # a glob or a sweep folder stands for all the runs it holds
            out += [next(loaded) for _ in expand_runs([p])]
    return out
