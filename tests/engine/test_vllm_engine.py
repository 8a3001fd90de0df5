"""The in-process engine: seeds, batching, token accounting, prefix cache, context guard."""

from __future__ import annotations

import itertools

import pytest

from ncp_local.engines.base import ContextOverflow, Engine, Message, Request


def _req(text: str, *, seed: int = 1, max_tokens: int = 16, temperature: float = 1.0, **kw) -> Request:
    return Request(
        messages=(Message("user", text),),
        temperature=temperature,
        top_p=0.95,
        max_tokens=max_tokens,
        seed=seed,
        **kw,
    )


def test_is_a_backend(engine) -> None:
    assert isinstance(engine.backend, Engine)


def test_same_seed_same_text(engine) -> None:
    req = _req("Tell me about a dragon in one sentence.", seed=1234, max_tokens=24)
    a = engine.run(engine.backend.generate(req))
    b = engine.run(engine.backend.generate(req))
    assert a.text == b.text
    assert a.generated_tokens == b.generated_tokens > 0
    # And the seed matters: at temperature 1 other seeds give other texts.
    others = engine.generate_all([_req(req.messages[0].content, seed=s, max_tokens=24) for s in (1, 2, 3)])
    assert len({a.text, *(o.text for o in others)}) > 1


def test_sixteen_concurrent_requests(engine) -> None:
    reqs = [_req(f"Write a short line about the number {i}.", seed=i, max_tokens=12) for i in range(16)]
    comps = engine.generate_all(reqs)
    assert len(comps) == 16
    for req, c in zip(reqs, comps, strict=True):
        assert c.finish_reason in ("stop", "length")
        assert c.prompt_tokens == engine.backend.count_tokens(req.messages) > 0
        assert 0 < c.generated_tokens <= 12
        assert c.latency_s > 0
        assert c.text


def test_length_cut_off_is_reported(engine) -> None:
    c = engine.run(engine.backend.generate(_req("Write a long story about a ship.", max_tokens=4, temperature=0.0)))
    assert c.finish_reason == "length"
    assert c.generated_tokens == 4


def test_prefix_cache_hits_on_repeated_long_prompt(engine) -> None:
    history = " ".join(f"Turn {i}: the narrator describes room {i} and its {i % 7} doors." for i in range(120))
    msgs = (Message("system", "You are the narrator."), Message("user", history + "\nWhat happens next?"))
    req = Request(messages=msgs, temperature=0.7, top_p=0.95, max_tokens=4, seed=5)
    first = engine.run(engine.backend.generate(req))
    second = engine.run(engine.backend.generate(req))
    assert first.prompt_tokens == second.prompt_tokens > 1500
    assert second.cached_tokens >= first.prompt_tokens // 2, (first, second)
    # A prompt that only shares the prefix reuses it too (turn t reuses turn t-1).
    longer = Request(
        messages=(msgs[0], Message("user", history + " Turn 120: a new room.\nWhat happens next?")),
        temperature=0.7,
        top_p=0.95,
        max_tokens=4,
        seed=6,
    )
    third = engine.run(engine.backend.generate(longer))
    assert third.cached_tokens >= first.prompt_tokens // 2


def test_bench_cache_model_predicts_the_engines_hits(engine) -> None:
    """mode=bench's unbounded-cache figure uses the engine's own block rule: it must match what vLLM reports."""
    from ncp_local.bench.cache_sim import unbounded_cache_hit

    backend = engine.backend
    assert backend.block_size and backend.max_num_seqs == 16
    base = " ".join(f"Beat {i}: the keeper locks gate {i} and hides key {i % 5}." for i in range(90))
    reqs = [
        Request(messages=(Message("user", text),), temperature=0.7, top_p=0.95, max_tokens=2, seed=i)
        for i, text in enumerate([base, base, base + " Beat 90: the lamp goes out.", "Other: " + base])
    ]
    engine.run(backend.reset_prefix_cache())
    measured = [engine.run(backend.generate(r)).cached_tokens for r in reqs]  # one at a time: nothing evicted
    hits = [unbounded_cache_hit(reqs[: i + 1], backend.tokenize, backend.block_size)[0][1] for i in range(len(reqs))]
    predicted = [b - a for a, b in itertools.pairwise([0, *hits])]
    assert measured[0] == 0 and measured[1] > 0 and measured[2] > 0 and measured[3] == 0
    assert predicted == measured


def test_context_overflow_is_raised_before_the_engine(engine) -> None:
    backend = engine.backend
    limit = backend.max_model_len
    huge = _req("word " * (limit + 100))
    with pytest.raises(ContextOverflow, match="max_model_len"):
        engine.run(backend.generate(huge))
    # A prompt just under the limit: fits alone, but not with one token too many.
    words = limit - 20
    n = backend.count_tokens((Message("user", "word " * words),))
    words -= n - (limit - 6)  # about one token per repeated word
    text = "word " * words
    n = backend.count_tokens((Message("user", text),))
    assert limit - 40 < n < limit
    # A call that needs one token more than the room left overflows...
    with pytest.raises(ContextOverflow, match=f"prompt of {n} tokens"):
        engine.run(backend.generate(_req(text, max_tokens=limit - n + 1, min_room=limit - n + 1)))
    # ...one that can make do with the room gets its budget clamped to it (up to
    # the limit exactly), and the engine still serves.
    ok = engine.run(backend.generate(_req(text, max_tokens=limit - n + 50, min_room=1, temperature=0.0)), timeout=300)
    assert ok.prompt_tokens == n and ok.max_tokens_sent == limit - n
    assert ok.prompt_tokens + ok.generated_tokens <= limit


def test_render_uses_the_models_chat_template(engine) -> None:
    text = engine.backend.render((Message("system", "S"), Message("user", "U")))
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"


def test_the_token_ids_sent_are_the_engines_own_tokenization(engine, embedded_model_path) -> None:
    """The rig's prompt (engines/chat_format.py) is vLLM's own chat path, token for token, and
    mode=plan's way (vLLM's tokenizer registry from the folder, no engine) counts the same."""
    from vllm.renderers.params import ChatParams

    from ncp_local.engines.chat_format import ChatFormat

    backend = engine.backend
    msgs = (
        Message("system", "You narrate. Facts:\n- f_0: the door is shut"),
        Message("user", 'I open the door — slowly — and call: "Anyone?" 42 times!'),
    )
    sent = backend.tokenize(msgs)
    # What vLLM's server does with the same chat request: its renderer, its tokenization.
    _, prompts = backend._engine.renderer.render_chat(
        [[{"role": m.role, "content": m.content} for m in msgs]],
        ChatParams(chat_template_kwargs={"add_generation_prompt": True}),
    )
    assert sent == list(prompts[0]["prompt_token_ids"])
    assert backend.chat.renderer is backend._engine.renderer
    assert ChatFormat.load(embedded_model_path, backend.cfg).tokenize(msgs) == sent
    # One cheap call: the engine ran exactly these tokens.
    out = engine.run(backend.generate(Request(messages=msgs, temperature=0.0, top_p=1.0, max_tokens=1, seed=3)))
    assert out.prompt_tokens == len(sent) and out.finish_reason == "length"
