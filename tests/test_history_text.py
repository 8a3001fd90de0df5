"""The history's texts rendered a turn at a time (prompts.rendered) are the texts rendered whole."""

from __future__ import annotations

import random
from typing import Any

import pytest

from ncp_local.protocol import ledger
from ncp_local.protocol.ledger import EpisodeState, Exchange
from ncp_local.protocol.prompts import _stripped, format_history, format_responses, rendered

# Texts that a careless renderer gets wrong: empty, blank, several lines, braces, leading newlines.
PIECES = ["", " ", "a", "line one\nline two", "\n\nlate first line\n", "{braces} {{", "NARRATOR: x", "é ✓", "[0] x"]


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 4)))


def _whole(state: EpisodeState, kind: str) -> str:
    if kind == "history":
        return format_history(state.opening, ((e.player_input, e.response) for e in state.exchanges))
    return format_responses(state.opening, (e.response for e in state.exchanges), kind == "first_lines")


def test_rendered_a_turn_at_a_time_equals_rendered_whole() -> None:
    """Random histories grown as an episode grows them (commits, the speculative player's copy, a
    resumed state, an opening set late), each text asked in random order: always the whole rendering."""
    for seed in range(300):
        rng = random.Random(seed)
        state = EpisodeState(facts=(), node_occurred=(), statuses=(), pending=ledger.FactUpdate())
        states = [state]
        for _ in range(rng.randint(1, 25)):
            kind = rng.choice(["history", "responses", "first_lines", "end", "none"])
            base = rng.choice(states[-3:])  # mostly the newest, sometimes an older state (a dropped turn)
            if kind == "end":
                p, r = _text(rng), _text(rng)
                exchanged = ledger.with_exchange(base, Exchange(player_input=p, response=r))
                assert rendered(exchanged, "history") == format_history(
                    base.opening, [*((e.player_input, e.response) for e in base.exchanges), (p, r)]
                )
                states.append(exchanged)  # the speculative player's copy, the turn's audits
                continue
            elif kind != "none":
                assert rendered(base, kind) == _whole(base, kind), (seed, kind)
            step = rng.random()
            if step < 0.1:
                nxt = base.model_copy(update={"opening": _text(rng)})  # the opening, once it is told
            elif step < 0.15:
                nxt = EpisodeState.model_validate_json(base.model_dump_json())  # resumed: equal, not the same
            elif step < 0.2 and base.exchanges:
                cut = rng.randrange(len(base.exchanges))  # not a continuation: a shorter or changed history
                changed = (Exchange(player_input=_text(rng), response=_text(rng)),) if rng.random() < 0.5 else ()
                nxt = base.model_copy(update={"exchanges": base.exchanges[:cut] + changed})
            elif step < 0.6:
                ex = Exchange(player_input=_text(rng), response=_text(rng))
                nxt = ledger.commit_turn(base, ledger.FactUpdate(), (), (), ex)
            else:  # as an episode commits: from the state with the exchange, rendered or not
                ex = Exchange(player_input=_text(rng), response=_text(rng))
                exchanged = ledger.with_exchange(base, ex)
                if rng.random() < 0.5:
                    rendered(exchanged, rng.choice(["history", "responses", "first_lines"]))
                nxt = ledger.commit_exchanged(exchanged, ledger.FactUpdate(), (), ())
                assert nxt == ledger.commit_turn(base, ledger.FactUpdate(), (), (), ex)
            states.append(nxt)
        for s in states:
            for kind in ("history", "responses", "first_lines"):
                assert rendered(s, kind) == _whole(s, kind), (seed, kind)


def test_the_kept_texts_never_tell_states_apart_nor_reach_the_record() -> None:
    ex = Exchange(player_input="hi", response="there")
    a = EpisodeState(facts=(), node_occurred=(), statuses=(), pending=ledger.FactUpdate(), exchanges=(ex,))
    b = a.model_copy()
    rendered(a, "history")
    assert a == b and b == a and a._rendered is not None
    assert a.model_dump_json() == b.model_dump_json() and "NARRATOR" not in a.model_dump_json()


def test_a_prompt_is_its_template_filled_and_stripped() -> None:
    """`render` strips the template's own blank ends before filling it (no copy of a long prompt to strip
    a file's last newline): the text must be the filled template stripped, whatever is blank where."""
    rng = random.Random(5)
    blanks = ("", " ", "\n", "\t\n ", "\x1c", "\u2028", "\u3000")
    for _ in range(2000):
        pieces = [rng.choice(blanks) + rng.choice(("", "a", "é", "{{", "}}")) + rng.choice(blanks) for _ in range(3)]
        template = pieces[0] + "{x}" + pieces[1] + "{y}" + pieces[2]
        variables = {k: rng.choice(blanks) + rng.choice(("", "v", "ü v")) + rng.choice(blanks) for k in "xy"}
        assert _stripped(template, variables) == template.format_map(variables).strip(), (template, variables)
    # Made by a join of the template's parts where each field is a plain name; by format_map where not (a
    # hand-made template) or where a value is not text; a history (a str subclass) is its text.
    state = EpisodeState(facts=(), node_occurred=(), statuses=(), pending=ledger.FactUpdate(), opening="o")
    history = rendered(state.model_copy(update={"exchanges": (Exchange(player_input="p", response="r"),)}), "history")
    cases: tuple[tuple[str, dict[str, Any]], ...] = (
        ("{x!r} and {y:>4}", {"x": "a", "y": "b"}),
        ("{x} {y}", {"x": 5, "y": None}),
        ("a {x}\n{y} z", {"x": history, "y": "b"}),
    )
    for template, variables in cases:
        want = template.format_map(variables).strip()
        assert _stripped(template, variables) == want and type(_stripped(template, variables)) is str, template
    with pytest.raises(KeyError):
        _stripped("{x} {y}", {"x": "a"})
