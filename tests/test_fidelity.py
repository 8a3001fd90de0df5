"""Paper fidelity (issue 12): what each model sees and may answer, and the official prompt files as they are."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from cli_runner import run_cli
from helpers import Scripted, conflicts, facts, make_spec, prompt, tag
from ncp_local.config import compose, validate
from ncp_local.engines.base import Request
from ncp_local.errors import InputError
from ncp_local.protocol.metrics import episode_metrics
from ncp_local.protocol.narrators import BaselineNarrator
from ncp_local.protocol.prompts import OFFICIAL_FILES, TEMPLATE_VARS, PromptPack, placeholders
from ncp_local.protocol.records import ConflictRecord

ROOT = Path(__file__).resolve().parent.parent


def _narrations(req: Request) -> Any:
    stage, _, turn, _ = tag(req)
    if stage in ("opening", "narrate"):
        return json.dumps({"text": f"Passage {turn} first line.\nPassage {turn} second line."})
    if stage == "player":
        return f"I try move number {turn}."
    if stage == "fact_update" and turn == -1:
        return facts(add=["the lantern is lit"])
    if stage == "trajectory_check":  # every turn completes the current node
        return json.dumps({"trigger": {"occurred": True, "reason": "r"}, "delta": {"occurred": True, "reason": "r"}})
    return None


def test_narrator_sees_current_node_only_and_its_own_passages_only(tmp_path: Path) -> None:
    spec = make_spec(n_nodes=5)
    run = Scripted(tmp_path, [spec], _narrations, max_turns=4)
    result = run.run()["tiny"]
    assert result.termination == "max_turns"
    opening = prompt(run.requests("opening")[0])
    assert "node 0 description" in opening and "trigger 0" in opening
    assert not any(f"node {k} description" in opening for k in range(1, 5))
    for k in range(4):
        text = prompt(run.requests("narrate", turn=k)[0])
        # Node k is current (one completes per turn): its id, description, trigger and delta, no later node.
        assert f"[s_{k}] node {k} description\n  trigger: trigger {k}\n  delta: delta {k}" in text
        assert not any(f"node {j} description" in text for j in range(k + 1, 5)), k
        # Its own past passages, whole; no earlier player input; this turn's input.
        for j in range(k):
            assert result.turns[j].response in text
            assert result.turns[j].player_input not in text, (k, j)
        assert result.turns[k].player_input in text
        assert result.opening in text
    # The opening's updates are pending on turn 0 only, then committed facts.
    t0, t1 = prompt(run.requests("narrate", turn=0)[0]), prompt(run.requests("narrate", turn=1)[0])
    assert "+ add: the lantern is lit" in t0.split("FACT UPDATES FROM THE OPENING")[1]
    assert "the lantern is lit" not in t1.split("FACT UPDATES FROM THE OPENING")[1]
    assert "] the lantern is lit" in t1.split("ESTABLISHED FACTS:")[1]


def test_paper_history_cuts_past_passages_to_their_first_line(tmp_path: Path) -> None:
    run = Scripted(
        tmp_path,
        [make_spec()],
        _narrations,
        max_turns=3,
        narrator=lambda pack, roles: BaselineNarrator(pack, history="first_line"),
    )
    run.run()
    text = prompt(run.requests("narrate", turn=2)[0])
    assert "[0] Passage -1 first line.\n\n[1] Passage 0 first line.\n\n[2] Passage 1 first line." in text
    assert "second line" not in text
    # The auditors still see whole passages.
    assert "Passage 1 second line." in prompt(run.requests("conflict_check", turn=2)[0])


def test_response_internal_ends_the_episode_as_a_fact_conflict(tmp_path: Path) -> None:
    def rules(req: Request) -> Any:
        stage, _, turn, _ = tag(req)
        if stage in ("conflict_check", "double_check") and turn == 1:
            extra = {"confirmed": True, "review_reason": "day and night at once"} if stage == "double_check" else {}
            return conflicts([("fact", "response_internal")], **extra)
        return _narrations(req)

    run = Scripted(tmp_path, [make_spec()], rules, max_turns=4)
    result = run.run()["tiny"]
    assert result.termination == "conflict" and len(result.turns) == 2
    assert result.turns[1].conflicts == (ConflictRecord(type="fact", id="response_internal", reason="r"),)
    m = episode_metrics(result)
    assert m.fact and not m.commitment and not m.player_input
    # The double-check is shown the narration itself as the conflict's target.
    dc = prompt(run.requests("double_check", turn=1)[0])
    targets = json.JSONDecoder().raw_decode(dc.split("each with the text it names):\n")[1])[0]
    assert targets == [
        {"type": "fact", "id": "response_internal", "target_text": result.turns[1].response, "reason": "r"}
    ]


def test_player_input_conflict_uses_the_id_input(tmp_path: Path) -> None:
    def rules(req: Request) -> Any:
        stage, _, turn, _ = tag(req)
        if stage == "conflict_check":
            return conflicts([("player_input", "player_input")])
        if stage == "double_check":
            return conflicts([("player_input", "input")], confirmed=True, review_reason="ignored the player")
        return None

    result = Scripted(tmp_path, [make_spec()], rules, max_turns=2).run()["tiny"]
    assert result.turns[0].conflict_check.conflicts[0].id == "input"
    assert result.turns[0].conflicts[0].id == "input" and episode_metrics(result).player_input


def test_unknown_negation_is_ignored_not_a_failed_attempt(tmp_path: Path) -> None:
    def rules(req: Request) -> Any:
        stage, _, turn, _ = tag(req)
        if stage == "fact_update" and turn == 0:
            return facts(add=["a new fact"], negate=["f_99", " f_1 ", "f_3"])  # f_3 is the fact it adds
        return None

    run = Scripted(tmp_path, [make_spec()], rules, max_turns=1)
    result = run.run()["tiny"]
    assert result.termination == "max_turns"
    assert all(c.error is None for c in run.calls() if c.stage == "fact_update")
    ledger = {f.id: (f.text, f.active) for f in result.final_state.facts}
    assert ledger["f_1"][1] is False and ledger["f_3"] == ("a new fact", False) and "f_99" not in ledger


def test_player_label_only_answer_is_retried(tmp_path: Path) -> None:
    def rules(req: Request) -> Any:
        stage, _, turn, attempt = tag(req)
        if stage == "player" and turn == 0:
            return ["Action:", '""', 'Action: "Let me in," I say.'][attempt]
        return None

    run = Scripted(tmp_path, [make_spec()], rules, max_turns=1)
    result = run.run()["tiny"]
    player_calls = [c for c in run.calls() if c.stage == "player" and c.turn == 0]
    assert [c.error is None for c in player_calls] == [False, False, True]
    assert "empty player input" in (player_calls[0].error or "")
    assert result.turns[0].player_input == '"Let me in," I say.'
    assert '"Let me in," I say.' in prompt(run.requests("narrate", turn=0)[0])


def test_bounds_are_role_config_tight_for_the_embedded_model_and_loose_under_paper() -> None:
    default = validate(_resolved([]))
    assert default.narrator.bounds.text_chars == 1000 and default.auditor.bounds.new_facts == 8
    assert default.player.bounds.player_chars == 350
    for overrides in (["experiment=paper"], ["narrator=qwen3", "player=qwen3", "auditor=qwen3_32b"]):
        cfg = validate(_resolved(overrides))
        for role in ("narrator", "player", "auditor"):
            assert all(v is None for v in getattr(cfg, role).bounds.model_dump().values()), (overrides, role)
    assert validate(_resolved(["experiment=paper"])).method["history"] == "first_line"


def _resolved(overrides: list[str]) -> dict[str, Any]:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(compose(overrides), resolve=True)  # type: ignore[return-value]


def test_bound_hits_go_to_the_call_log_and_the_turn_record(tmp_path: Path) -> None:
    from ncp_local.protocol.stages import TIGHT

    def rules(req: Request) -> Any:
        stage, _, turn, _ = tag(req)
        if stage == "fact_update" and turn == 0:
            return facts(add=[f"fact number {i}" for i in range(8)])
        return None

    run = Scripted(tmp_path, [make_spec()], rules, max_turns=1, bounds={"auditor": TIGHT})
    result = run.run()["tiny"]
    assert result.turns[0].bound_hits == ("fact_update:new_facts",)
    logged = [c for c in run.calls() if c.bound_hits]
    assert [(c.stage, c.turn, c.bound_hits) for c in logged] == [("fact_update", 0, ("fact_update:new_facts",))]


# ---- the official prompt files ------------------------------------------


def test_official_pack_loads_unchanged_with_every_stage_mapped(official_prompts: Path) -> None:
    for root in (official_prompts, official_prompts / "src" / "ncpbench" / "prompts"):
        pack = PromptPack.load(root, required=("narrate", "hiagent_narrate", *OFFICIAL_FILES.values()))
        assert pack.official and pack.root.resolve() == official_prompts.resolve()
        for name, file in OFFICIAL_FILES.items():
            assert pack.templates[file] == (official_prompts / "src/ncpbench/prompts" / name).read_text()
        assert pack.files["narrate"].startswith("reference-methods/baseline/")
        assert pack.files["hiagent_narrate"].startswith("reference-methods/hiagent/")
        assert pack.files["hiagent_summarize"] == "(rig) hiagent_summarize.txt"


def test_official_templates_use_only_provided_placeholders_and_literal_braces(official_prompts: Path) -> None:
    pack = PromptPack.load(official_prompts)
    for name, text in pack.templates.items():
        assert placeholders(Path(name), text) <= TEMPLATE_VARS[name]
    rendered = pack.render("conflict_check", {k: f"<{k}>" for k in TEMPLATE_VARS["conflict_check"]})[0].content
    assert '"conflicts": [' in rendered and "{{" not in rendered and "<trajectory_progress>" in rendered


def test_scripted_episodes_run_on_the_official_prompts(official_prompts: Path, tmp_path: Path) -> None:
    run = Scripted(tmp_path, [make_spec("a"), make_spec("b")], None, max_turns=3, pack_dir=official_prompts)
    results = run.run()
    assert {r.termination for r in results.values()} <= {"max_turns", "all_resolved", "conflict"}
    narrate = prompt(run.requests("narrate")[0])
    assert "<player_claims_and_attempts>" in narrate and "node 0 description" in narrate
    assert "node 1 description" not in narrate


@pytest.mark.parametrize("breakage", ["misspelt", "removed", "empty", "binary", "attribute"])
def test_broken_official_pack_stops_before_anything_runs(official_prompts: Path, tmp_path: Path, breakage: str) -> None:
    pack = tmp_path / "clone"
    shutil.copytree(official_prompts, pack)
    target = pack / "src/ncpbench/prompts/fact_update.txt"
    if breakage == "misspelt":
        target.write_text(target.read_text().replace("{pre_turn_facts}", "{pre_turn_factz}"))
    elif breakage == "removed":
        target.unlink()
    elif breakage == "empty":
        target.write_text("  \n")
    elif breakage == "binary":
        target.write_bytes(b"\xff\xfe\x00garbage")
    else:
        target.write_text(target.read_text().replace("{pre_turn_facts}", "{pre_turn_facts.__class__}"))
    out = tmp_path / "run"
    proc = run_cli(
        "engine=scripted", f"prompts.dir={pack}", "max_turns=1", f"out_dir={out}", "progress=false", cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "fact_update" in lines[0] and "prompts.dir" in lines[0]
    if breakage == "misspelt":
        assert "{pre_turn_factz}" in lines[0]
    assert not out.exists()  # nothing written


def test_rig_pack_narrator_template_cannot_reach_later_beats(tmp_path: Path) -> None:
    """A narrator template asking for the whole trajectory or the full history is refused up front."""
    for forbidden in ("trajectory_progress", "trajectory_nodes", "history_text"):
        pack = tmp_path / forbidden
        shutil.copytree(ROOT / "prompts", pack)
        (pack / "narrate.txt").write_text("{player_role} {" + forbidden + "}")
        with pytest.raises(InputError, match=rf"placeholder \{{{forbidden}\}} is not provided to the narrate stage"):
            PromptPack.load(pack)
