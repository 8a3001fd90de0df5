"""PROTOCOL section 2: the fact ledger, nodes and commitment state."""

from __future__ import annotations

import random

from helpers import make_spec
from ncp_local.protocol import ledger
from ncp_local.protocol.ledger import FactEntry, FactUpdate
from ncp_local.protocol.spec import InitialFact


def _facts(*ids_active: tuple[str, bool]) -> tuple[FactEntry, ...]:
    return tuple(FactEntry(id=i, text=f"text {i}", active=a) for i, a in ids_active)


def test_new_ids_count_inactive_facts() -> None:
    facts = _facts(("f_0", True), ("f_1", False))
    out = ledger.apply_update(facts, FactUpdate(add_facts=("new",)))
    assert out[-1].id == "f_2" and out[-1].active


def test_id_collision_gets_suffixes() -> None:
    # f_2 is taken by an earlier suffix-free id, so the next addition must dodge it.
    facts = _facts(("f_0", True), ("f_2", True))
    out = ledger.apply_update(facts, FactUpdate(add_facts=("a", "b")))
    assert [f.id for f in out] == ["f_0", "f_2", "f_2_2", "f_3"]
    facts = _facts(("f_0", True), ("f_2", True), ("f_2_2", True))
    out = ledger.apply_update(facts[:2] + (FactEntry(id="f_2_2", text="x", active=True),), FactUpdate(add_facts=("c",)))
    assert out[-1].id == "f_3"
    facts = _facts(("f_3", True), ("f_1", True), ("f_3_2", True))
    out = ledger.apply_update(facts, FactUpdate(add_facts=("d",)))
    assert out[-1].id == "f_3_3"


def test_the_ids_offered_ahead_are_the_ids_additions_get() -> None:
    """The grammar offers `next_fact_ids`; the ledger gives `apply_update`'s: the same ids, on ledgers whose
    ids collide with the next ones (each id computed from the ids so far, as one at a time did)."""
    rng = random.Random(7)
    for _ in range(300):
        ids = [rng.choice(["f_{}", "f_{}_2", "f_{}_3"]).format(rng.randrange(12)) for _ in range(rng.randrange(10))]
        facts = _facts(*((i, rng.random() < 0.5) for i in dict.fromkeys(ids)))
        k = rng.randrange(1, 9)
        added = ledger.apply_update(facts, FactUpdate(add_facts=("x",) * k))[len(facts) :]
        assert ledger.next_fact_ids(facts, k) == tuple(f.id for f in added)
        taken = [f.id for f in facts]
        for f in added:  # the rule: f_<n> (n counting every fact before), else its first free suffix
            n, suffix = len(taken), 2
            want = f"f_{n}"
            while want in taken:
                want, suffix = f"f_{n}_{suffix}", suffix + 1
            assert f.id == want
            taken.append(want)


def test_blank_additions_skipped_and_text_stripped() -> None:
    out = ledger.apply_update(_facts(("f_0", True)), FactUpdate(add_facts=("  ", "", " real fact ")))
    assert [(f.id, f.text) for f in out] == [("f_0", "text f_0"), ("f_1", "real fact")]


def test_negating_an_inactive_fact_leaves_it_inactive() -> None:
    # PROTOCOL section 2: a negation ends a fact; one already ended stays ended (it never flips back),
    # and negating it twice in one update is negating it once.
    facts = _facts(("f_0", False), ("f_1", True))
    out = ledger.apply_update(facts, FactUpdate(negate_facts=("f_0", "f_1", "f_1")))
    assert [(f.id, f.active) for f in out] == [("f_0", False), ("f_1", False)]
    again = ledger.apply_update(out, FactUpdate(negate_facts=("f_0", "f_1")))
    assert again == out


def test_unknown_negation_ignored_and_additions_before_negations() -> None:
    facts = _facts(("f_0", True), ("f_1", True))
    out = ledger.apply_update(facts, FactUpdate(add_facts=("new",), negate_facts=("f_9", "f_2", "f_0")))
    # f_2 is the fact added in the same update: additions come first, so it can be negated.
    assert [(f.id, f.active) for f in out] == [("f_0", False), ("f_1", True), ("f_2", False)]


def test_inactive_facts_never_shown_but_kept() -> None:
    spec = make_spec()
    spec = spec.__class__(
        spec.meta,
        spec.synopsis,
        (InitialFact("f_0", "hidden", negated=True), InitialFact("f_1", "shown")),
        spec.commitments,
        spec.trajectory,
    )
    state = ledger.initial_state(spec)
    assert [f.id for f in state.facts] == ["f_0", "f_1"]
    assert [f.id for f in ledger.active_facts(state.facts)] == ["f_1"]
    assert ledger.apply_update(state.facts, FactUpdate(add_facts=("x",)))[-1].id == "f_2"


def test_current_node_and_first_pending() -> None:
    assert ledger.current_node((False, False)) == 0
    assert ledger.current_node((True, False)) == 1
    assert ledger.first_pending_node((True, True)) is None
    assert ledger.current_node((True, True)) == 1  # all occurred: the last, for display
    assert ledger.complete_node((True, False, False), 1) == (True, True, False)


def test_commit_applies_pending_before_turn_updates() -> None:
    spec = make_spec(n_facts=2)
    state = ledger.initial_state(spec).model_copy(update={"pending": FactUpdate(add_facts=("from opening",))})
    new = ledger.commit_turn(
        state,
        FactUpdate(add_facts=("from turn 0",), negate_facts=("f_2",)),
        state.node_occurred,
        state.statuses,
        ledger.Exchange(player_input="p", response="r"),
    )
    assert [(f.id, f.text, f.active) for f in new.facts[2:]] == [
        ("f_2", "from opening", False),
        ("f_3", "from turn 0", True),
    ]
    assert new.pending.empty and len(new.exchanges) == 1
    assert state.pending.add_facts == ("from opening",)  # the old state is untouched


def test_all_resolved_needs_every_achievement() -> None:
    spec = make_spec(types=("ordering", "achievement", "achievement"))
    assert not ledger.all_resolved(spec, (("c_0", "pending"), ("c_1", "satisfied"), ("c_2", "pending")))
    assert ledger.all_resolved(spec, (("c_0", "pending"), ("c_1", "satisfied"), ("c_2", "satisfied")))
    no_ach = make_spec(types=("ordering",))
    assert not ledger.all_resolved(no_ach, (("c_0", "satisfied"),))
