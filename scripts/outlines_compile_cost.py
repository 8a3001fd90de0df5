"""What outlines pays to compile each audit stage's grammar, as vLLM compiles it (issue 26).

Builds each auditor stage's schema for the first turn of a spec (its initial facts and
commitments, the embedded auditor's bounds), adapts it for outlines as the engine does, and
times outlines_core's index over vLLM's own outlines vocabulary of the embedded tokenizer: the
work vLLM does for a grammar it has not seen. One line per stage, then the total.

    python scripts/outlines_compile_cost.py            # this checkout
    PYTHONPATH=<another checkout> python scripts/outlines_compile_cost.py   # e.g. the code before

With ids as enums of the state (before issue 26) nearly every audit call is a new grammar, so the
figure is paid per call; with ids as patterns each stage is one grammar per run (the status check:
per spec), so it is paid once.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import outlines_core
import outlines_core.json_schema as outlines_schema
from transformers import AutoTokenizer
from vllm.v1.structured_output.utils import get_outlines_vocabulary

from ncp_local.engines import grammar
from ncp_local.engines.embedded import ensure_embedded_model
from ncp_local.protocol import ledger
from ncp_local.protocol.episode import audit_ids
from ncp_local.protocol.spec import load_dataset
from ncp_local.protocol.stages import TIGHT, AuditIds, schema_for

STAGES = ("fact_update", "conflict_check", "double_check", "trajectory_check", "status_check")


def main() -> int:
    specs = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "specs"
    spec = load_dataset(specs).specs[0]
    tokenizer = AutoTokenizer.from_pretrained(str(ensure_embedded_model()), local_files_only=True)
    vocabulary = get_outlines_vocabulary(tokenizer)
    form = getattr(grammar, "id_form", lambda backend: "enum")("outlines")  # the code before had enums only
    state = ledger.initial_state(spec)
    ids = audit_ids(spec, ledger.projected_facts(state))
    per_stage = {"status_check": AuditIds(commitment_ids=ids.commitment_ids), "trajectory_check": AuditIds()}
    total = 0.0
    print(f"spec {spec.id}: {len(ids.fact_ids)} facts, {len(ids.commitment_ids)} commitments; ids as {form}s")
    for stage in STAGES:
        call_ids = per_stage.get(stage, ids)
        schema = schema_for(stage, call_ids, TIGHT, form) if form != "enum" else schema_for(stage, call_ids, TIGHT)
        regex = outlines_schema.build_regex_from_schema(json.dumps(grammar.adapt_schema(schema, "outlines")))
        started = time.perf_counter()
        outlines_core.Index(regex, vocabulary.inner)
        took = time.perf_counter() - started
        total += took
        print(f"{stage:17s} {took:7.1f} s  (regex {len(regex)} chars)")
    print(f"{'all five':17s} {total:7.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
