"""Trials (issue 37): k plays per story, named apart, seeded per role, resumed like episodes.

Played on the scripted engine, whose answers are drawn from each call's seed, so two trials
differ exactly where their seeds do."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from cli_runner import run_cli
from ncp_local import config as config_mod
from ncp_local.protocol.metrics import EpisodeMetrics, km_survival
from ncp_local.protocol.spec import ID_PATTERN
from ncp_local.protocol.trials import SEPARATOR, episode_name, parse_episode, seed_episode
from ncp_local.report.stats import bootstrap
from ncp_local.report.trials import Story, noise_floor, pass_k
from ncp_local.rundir import identity

STORIES = ("red_riding_hood", "treasure_island", "hound_of_the_baskervilles")  # specs/ (dataset=local)


def _run(out: Path, *extra: str) -> Any:
    done = run_cli("engine=scripted", "max_turns=6", f"out_dir={out}", "progress=false", *extra)
    assert done.returncode == 0, done.stderr
    return done


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "results").glob("*.json"))}


def _calls(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]


def test_episode_names_round_trip_and_never_read_as_a_spec() -> None:
    assert episode_name("movie09", 0) == "movie09"
    assert episode_name("movie09", 3) == f"movie09{SEPARATOR}3"
    for name in ("movie09", "a.b-c_d", "movie09~t1", "movie09~t12"):
        assert episode_name(*parse_episode(name)) == name
    # The separator is no spec id character, so no spec id is taken for another story's trial.
    assert not ID_PATTERN.fullmatch(f"movie09{SEPARATOR}1")
    # Trial 0 has no suffix (`x~t0` would be a second name for `x`), nor a trial a leading zero.
    for bad in ("movie09~t0", "movie09~t01", "movie09~tx", "~t1", ""):
        with pytest.raises(ValueError):
            parse_episode(bad)


def test_seed_episode_follows_vary() -> None:
    only_auditor = frozenset({"auditor"})
    assert seed_episode("s~t2", "auditor", only_auditor) == "s~t2"
    assert seed_episode("s~t2", "narrator", only_auditor) == "s"
    assert seed_episode("s", "auditor", only_auditor) == "s"  # trial 0 is trial 0 whatever varies


def _raw(*overrides: str) -> dict[str, Any]:
    from omegaconf import OmegaConf

    cfg = config_mod.compose(["engine=scripted", *overrides])
    raw = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(raw, dict)
    return raw


def test_identity_keeps_its_key_without_trials_and_with_any_count() -> None:
    base = _raw()
    before_trials = {k: v for k, v in base.items() if k != "trials"}  # a config of the rig before trials
    key = identity.settings(before_trials)
    assert identity.settings(base) == key
    assert identity.settings(_raw("trials.count=4")) == key  # a count is resumed, like `limit`
    assert identity.settings(_raw("trials.vary=[narrator,player,auditor]")) == key  # all roles, spelt out
    # Which roles vary changes what trials 1.. play: another experiment, another run directory.
    assert identity.settings(_raw("trials.vary=[auditor]")) != key
    assert identity.settings(_raw("trials.vary=[auditor]")) == identity.settings(_raw("trials.vary=[auditor]"))


def test_raising_trials_on_a_finished_run_plays_only_the_new_trials(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _run(out)
    one = _files(out)
    assert sorted(one) == sorted(f"{s}.json" for s in STORIES)
    calls_before = _calls(out)
    _run(out, "trials.count=2")
    two = _files(out)
    # Trial 0's files are untouched; each story gained its trial 1.
    assert {k: v for k, v in two.items() if k in one} == one
    assert sorted(set(two) - set(one)) == sorted(f"{s}~t1.json" for s in STORIES)
    new = _calls(out)[len(calls_before) :]
    assert new and all(c.get("trial") == 1 for c in new)
    assert "trial" not in json.dumps(calls_before)  # trial 0's log lines are a run without trials' lines
    for s in STORIES:
        t1 = json.loads(two[f"{s}~t1.json"])
        assert t1["trial"] == 1 and t1["seal"]["trial"] == 1 and t1["spec_id"] == s
    # Seed-dependent answers: the second plays are not copies of the first.
    assert any(json.loads(two[f"{s}~t1.json"])["turns"] != json.loads(one[f"{s}.json"])["turns"] for s in STORIES)
    again = _run(out, "trials.count=2")
    assert "already finished" in again.stdout


def test_rerun_repeats_every_trial_a_resume_added(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _run(out)
    _run(out, "trials.count=2")
    again = run_cli("mode=rerun", f"from={out}", f"out_dir={tmp_path / 'again'}", "progress=false")
    assert again.returncode == 0, again.stderr
    # The same identity (a rerun checks it), so the same sealed files, byte for byte.
    assert _files(tmp_path / "again") == _files(out) and len(_files(out)) == 2 * len(STORIES)


def test_vary_auditor_keeps_trial_zero_seeds_for_narrator_and_player(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _run(out, "trials.count=2", "trials.vary=[auditor]", "limit=1")
    calls = [c for c in _calls(out) if not c.get("speculative")]
    key = ("turn", "stage", "key", "attempt")
    seeds = {
        t: {tuple(c[k] for k in key): (c["role"], c["seed"]) for c in calls if c.get("trial", 0) == t} for t in (0, 1)
    }
    shared = set(seeds[0]) & set(seeds[1])
    roles = {seeds[0][k][0] for k in shared}
    assert {"narrator", "player", "auditor"} <= roles
    for k in shared:
        role, seed0 = seeds[0][k]
        same = seeds[1][k][1] == seed0
        assert same == (role != "auditor"), (k, role)


def test_a_run_killed_mid_way_resumes_to_the_uninterrupted_results(tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    _run(whole, "trials.count=3", "concurrency=2")
    expected = _files(whole)
    assert len(expected) == 9
    out = tmp_path / "killed"
    dead = run_cli(
        "engine=scripted",
        "max_turns=6",
        f"out_dir={out}",
        "progress=false",
        "trials.count=3",
        "concurrency=2",
        "engine.die_after_calls=60",
    )
    assert dead.returncode == 3, dead.stderr
    assert len(_files(out)) < 9 and list((out / "checkpoints").glob(f"*{SEPARATOR}*.jsonl"))
    _run(out, "trials.count=3", "concurrency=2")
    assert _files(out) == expected
    assert not list((out / "checkpoints").glob("*.jsonl"))


@pytest.mark.parametrize(("shards", "together"), [(3, True), (2, False)])
def test_shards_split_trials_as_balances_best_and_merge_to_the_unsharded_run(
    tmp_path: Path, shards: int, together: bool
) -> None:
    # 3 stories x 2 trials: 3 shards hold a story each, its 2 trials together (2 episodes a shard);
    # 2 shards would hold 4 and 2 that way, so they deal the 6 episodes out, 3 each.
    whole = tmp_path / "whole"
    _run(whole, "trials.count=2")
    out = tmp_path / "sharded"
    said = [_run(out, "trials.count=2", f"shard.count={shards}", f"shard.index={i}").stdout for i in range(shards)]
    assert all(("together" in line) == together for line in said), said
    held = [{p.stem for p in (d / "results").glob("*.json")} for d in sorted(out.glob("shard-*"))]
    assert sorted(len(h) for h in held) == [6 // shards] * shards
    stories_split = any(len({parse_episode(n)[0] for n in h}) != len(h) // 2 for h in held)
    assert stories_split != together
    merged = run_cli("mode=merge", f"out_dir={out}", "progress=false")
    assert merged.returncode == 0, merged.stderr
    assert _files(out / "merged") == _files(whole)  # the same episodes, byte for byte, however split
    assert json.loads((out / "merged" / "manifest.json").read_text())["trials"] == 2


# ---- the report's trials section --------------------------------------------------------


def _play(spec_id: str, trial: int, turns: int, termination: str = "conflict") -> EpisodeMetrics:
    return EpisodeMetrics(spec_id, termination, turns, 0.0, 0.0, termination == "conflict", False, False, trial=trial)


def test_pass_k_is_the_share_of_k_subsets_that_all_survive() -> None:
    # Story a: plays surviving 3, 5, 1, 8 turns; story b: 2, 2, 9, 9.
    a = Story("a", tuple(_play("a", i, n) for i, n in enumerate((3, 5, 1, 8))))
    b = Story("b", tuple(_play("b", i, n) for i, n in enumerate((2, 2, 9, 9))))
    # At t=3: a has c=3 of 4, b has c=2 of 4.
    assert pass_k([a, b], 1, 3) == pytest.approx((3 / 4 + 2 / 4) / 2)
    assert pass_k([a, b], 2, 3) == pytest.approx((math.comb(3, 2) / 6 + math.comb(2, 2) / 6) / 2)
    assert pass_k([a, b], 4, 3) == 0.0
    assert pass_k([a, b], 4, 1) == 1.0
    # A play censored after 2 turns is seen surviving up to t=3 only; past that its fate is unknown. The
    # plays whose fate at t is known weigh 1/G: censoring took 1 of the 3 plays still going after turn 2,
    # so G(6) = 2/3 weighs the two seen surviving 6 turns (3/2 each), and G(2) = 1 the one that ended at
    # turn 1. pass^1 = (3/2 + 3/2) / (3/2 + 3/2 + 1) = 3/4, which is Kaplan-Meier's S(6) (3 of 4 survive
    # turn 1's ending, and nothing else ends before 6); leaving the censored play out would give 2/3 (the
    # downward bias). pass^2: the one pair seen surviving weighs 9/4, the three pairs whose fates are known
    # 9/4 + 3/2 + 3/2, so 3/7 (dividing by G(6)^2 and not by the known pairs' weight gave 3/8, and could pass 1).
    c = Story("c", (_play("c", 0, 2, "context_limit"), _play("c", 1, 7), _play("c", 2, 6), _play("c", 3, 1)))
    assert pass_k([c], 1, 3) == pytest.approx(3 / 4)
    assert pass_k([c], 1, 6) == pytest.approx(3 / 4)
    s6 = km_survival([m.turns for m in c.plays], [m.censored for m in c.plays], 7).s[6]
    assert pass_k([c], 1, 6) == pytest.approx(s6)
    assert pass_k([c], 2, 6) == pytest.approx(3 / 7)
    assert math.isnan(pass_k([c], 4, 6))  # the censored play's fate at 6 is unknown: no 4 plays all known
    assert math.isnan(pass_k([Story("d", c.plays[:3])], 4, 6))  # fewer than 4 plays


def test_noise_floor_by_hand() -> None:
    # Turns 1, 3 (story a) and 5, 7 (story b): within = (1+1+1+1)/2 = 2; story means 2 and 6, their
    # variance 8, between = 8 - 2 * (1/2) = 7.
    a = Story("a", (_play("a", 0, 1), _play("a", 1, 3)))
    b = Story("b", (_play("b", 0, 5), _play("b", 1, 7)))
    turns = next(n for n in noise_floor([a, b], 0.95) if n.metric == "avg_turns")
    z = 1.959963984540054
    assert (turns.within, turns.between, turns.ratio) == pytest.approx((2.0, 7.0, 2 / 7))
    assert turns.mdd_replay == pytest.approx(z * math.sqrt(2 * 2 / (2 * 2)))
    assert turns.mdd_runs == pytest.approx(z * math.sqrt(2 * (7 / 2 + 2 / 4)))


def test_story_bootstrap_draws_a_storys_trials_together() -> None:
    # Four stories of five plays: two always end at 0, two at 1.
    values = [0.0] * 10 + [1.0] * 10
    stories = [s for s in "abcd" for _ in range(5)]
    by_story = bootstrap({"x": values}, 2000, 0, 0.95, groups=stories)["x"]
    by_episode = bootstrap({"x": values}, 2000, 0, 0.95)["x"]
    # Drawing stories, a resample's mean is a multiple of 1/4 and often 1/4 or 3/4: the spread of four
    # stories, not of twenty independent plays.
    assert by_story.lo <= 0.25 and by_story.hi >= 0.75
    assert 0.25 < by_episode.lo < by_episode.hi < 0.75
    # One play per story: the draws are the episode bootstrap's, so a run of one trial reports as before.
    assert bootstrap({"x": values}, 2000, 0, 0.95, groups=[str(i) for i in range(20)]) == {"x": by_episode}


def test_report_of_four_trials(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _run(out, "trials.count=4", "max_turns=8")
    rep = run_cli("mode=report", f"runs=[{out}]", "progress=false")
    assert rep.returncode == 0, rep.stderr
    html = (out / "report" / "index.html").read_text()
    assert "Trials: pass^k and the noise floor" in html and "pass^4 %" in html
    assert (out / "report" / "episodes").is_dir() and any((out / "report" / "episodes").rglob("*~t3.html"))
    rows = list(csv.DictReader((out / "report" / "passk.csv").open()))
    assert {int(r["k"]) for r in rows} == {1, 2, 3, 4}
    # Three stories are too few for pass^k past t = 0 (10 observed ones needed): no figure, no band, and the
    # reason, in the CSV and under the table; never a band of zero width around the point.
    for r in rows:
        if r["t"] == "0":
            assert (r["pass_k"], r["pass_k_lo"], r["pass_k_hi"], r["not_estimable"]) == ("1.0", "1.0", "1.0", "")
        else:
            assert (r["pass_k"], r["pass_k_lo"], r["pass_k_hi"]) == ("", "", "")
            assert r["not_estimable"] == f"3 stories with {r['k']} plays observed at t={r['t']} (needs 10)"
    md = (out / "report" / "results.md").read_text()
    assert "| pass^4 % | not estimable |" in md and "pass^4 not estimable at t=1: 3 stories with 4 plays" in md
    noise = list(csv.DictReader((out / "report" / "noise.csv").open()))
    assert {r["metric"] for r in noise} >= {"avg_turns", "conflict_free_pct"}
    stories = list(csv.DictReader((out / "report" / "stories.csv").open()))
    assert sorted(r["spec_id"] for r in stories) == sorted(STORIES)
    assert all(r["plays"] == "4" and len(r["endings"].split()) == 4 for r in stories)
    text = (out / "report" / "results.md").read_text()
    assert "## Trials: pass^k and the noise floor" in text and "pass^4 %" in text
    # The cost table counts each trial's calls (together the run's) and the average story's.
    cost = {(r["per"], r["role"]): r for r in csv.DictReader((out / "report" / "cost.csv").open())}
    by_trial = [int(cost[f"trial {t}", "all"]["calls"]) for t in range(4)]
    assert all(by_trial) and sum(by_trial) == int(cost["run", "all"]["calls"])
    assert float(cost["story", "all"]["calls"]) == pytest.approx(sum(by_trial) / len(STORIES))


def test_a_trials_run_beside_a_single_play_run_resamples_each_by_its_own_plays(tmp_path: Path) -> None:
    """A report of a 3-trial run and a single-play run (documented in docs/guide/trials.md): each run's
    intervals follow protocol/resample.py for its own episodes, so the single-play run's figures are the
    ones its own report gives, and only the trials run has a trials section."""
    single, many = tmp_path / "single", tmp_path / "many"
    _run(single)
    _run(many, "trials.count=3")
    alone = run_cli("mode=report", f"runs=[{single}]", "report.html=false", "progress=false")
    assert alone.returncode == 0, alone.stderr
    solo = (single / "report" / "survival.csv").read_text().splitlines()
    both = run_cli("mode=report", f"runs=[{single},{many}]", "report.html=false", "progress=false")
    assert both.returncode == 0, both.stderr
    mixed = list(csv.reader((single / "report" / "survival.csv").open()))
    # The first run's columns (S, lo, hi, censored) are its solo report's, value for value.
    assert [r[:5] for r in mixed[1:]] == [line.split(",")[:5] for line in solo[1:]]  # labels differ
    text = (single / "report" / "results.md").read_text()
    assert text.count("### ") >= 1 and "3 trials of 3 stories" in text
    results = list(csv.DictReader((single / "report" / "results.csv").open()))
    assert len(results) == 2


def test_one_name_for_a_trial_in_files_report_tables_and_exports(tmp_path: Path) -> None:
    """A story's trial k > 0 is `<spec>~t<k>` in the results, the report's pages, the analysis tables,
    the reference export's folders and the submission's listing; nothing spells it another way."""
    import tarfile

    import pyarrow.parquet as pq

    out = tmp_path / "run"
    _run(out, "trials.count=3", "max_turns=3")
    for args in (
        ("mode=report",),
        ("mode=export", "export.format=parquet"),
        ("mode=export", "export.format=reference"),
        ("mode=submission", f"submission={tmp_path / 'sub.tar.gz'}"),
    ):
        done = run_cli(*args, f"runs=[{out}]", "progress=false")
        assert done.returncode == 0, done.stderr
    names = {episode_name(s, t) for s in STORIES for t in range(3)}
    assert {p.stem for p in (out / "results").glob("*.json")} == names
    assert {p.stem for p in (out / "report" / "episodes").rglob("*.html")} == names
    for table in ("episodes", "turns", "calls"):
        assert set(pq.read_table(out / "parquet" / f"{table}.parquet").column("episode").to_pylist()) == names
    assert sorted(p.name for p in (out / "reference").iterdir()) == [episode_name("run", t) for t in range(3)]
    with tarfile.open(tmp_path / "sub.tar.gz") as tar:
        listed = {Path(m).stem for m in tar.getnames() if "/results/" in m}
    assert listed == names
    text = "\n".join(p.read_text() for p in (out / "report").glob("*.*") if p.suffix in (".md", ".csv", ".html"))
    assert not re.search(r"\b(?:red_riding_hood|treasure_island|hound_of_the_baskervilles)#\d", text)


def test_analysis_reads_an_old_exports_trial_spelling(tmp_path: Path) -> None:
    """Exports before 2026-12-05 wrote `<spec>#<k>`; reading one gives the name the files use."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ncp_local import analysis

    out = tmp_path / "run"
    _run(out, "trials.count=2", "max_turns=2")
    assert run_cli("mode=export", "export.format=parquet", f"runs=[{out}]").returncode == 0
    path = out / "parquet" / "episodes.parquet"
    table = pq.read_table(path)
    old = [e.replace(SEPARATOR, "#") for e in table.column("episode").to_pylist()]
    i = table.column_names.index("episode")
    pq.write_table(table.set_column(i, table.schema.field(i), pa.array(old, pa.string())), path)
    assert any("#" in e for e in pq.read_table(path).column("episode").to_pylist())
    eps = analysis.episodes(out / "parquet")
    assert set(eps.episode) == {episode_name(s, t) for s in STORIES for t in range(2)}


def test_inspect_export_maps_trials_to_epochs(tmp_path: Path) -> None:
    log_mod = pytest.importorskip("inspect_ai.log", reason="inspect_ai is not installed (the `inspect` extra)")
    out = tmp_path / "run"
    _run(out, "trials.count=2")
    res = run_cli("mode=export", f"runs=[{out}]", f"export.out={tmp_path / 'logs'}", "progress=false")
    assert res.returncode == 0, res.stderr[-2000:]
    [path] = sorted((tmp_path / "logs").glob("*.eval"))
    log = log_mod.read_eval_log(str(path))
    assert log.eval.config.epochs == 2
    assert sorted((s.id, s.epoch) for s in log.samples) == sorted((s, e) for s in STORIES for e in (1, 2))


def test_one_trial_has_no_trials_section(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _run(out)
    rep = run_cli("mode=report", f"runs=[{out}]", "report.html=false", "progress=false")
    assert rep.returncode == 0, rep.stderr
    assert "Trials" not in (out / "report" / "results.md").read_text()
    assert not (out / "report" / "passk.csv").exists()


def test_every_trials_column_is_defined_and_documented() -> None:
    from ncp_local.report.glossary import TRIALS_GLOSSARY, define_trials
    from ncp_local.report.trials import RunTrials
    from ncp_local.report.trials_doc import STORY_HEADER, noise_table, passk_table

    band = ((1.0,) * 5, (1.0,) * 5)
    rt = RunTrials("r", 3, 4, [], {k: (1.0,) * 5 for k in (1, 2, 3)}, (1.0,) * 5, [], {k: band for k in (1, 2, 3)})
    shown = [*noise_table(rt, 0.95)[0], *passk_table(rt)[0][1:], *(row[0] for row in passk_table(rt)[1])]
    shown += STORY_HEADER[2:]
    for column in shown:
        assert define_trials(column)  # KeyError for a column nobody defined
    from test_docs import gen  # scripts/gen_reference.py, loaded once for the docs' tests

    page = gen.generate("trials-columns")
    assert all(f"| `{c}` |" in page for c, _ in TRIALS_GLOSSARY)
