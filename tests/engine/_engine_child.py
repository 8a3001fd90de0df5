"""Helper process for test_vllm_lifecycle: one small engine, then idle until killed.

Prints `ENGINE-CHILD-READY {json}` once the engine is up and has answered (vLLM logs to stdout too,
hence the marker).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

READY = "ENGINE-CHILD-READY "


async def main(model_path: str) -> None:
    from ncp_local.engines.base import Message, Request
    from ncp_local.engines.settings import ModelSettings
    from ncp_local.engines.vllm import VLLMEngine

    cfg = ModelSettings(
        name="child",
        path=model_path,
        max_model_len=512,
        kv_cache_memory_bytes=128 << 20,
        max_num_seqs=2,
        enforce_eager=True,
    )
    engine = await VLLMEngine.start(cfg)
    await engine.generate(Request(messages=(Message("user", "Hi"),), temperature=0.0, top_p=1.0, max_tokens=2, seed=0))
    print(READY + json.dumps({"pid": os.getpid(), "engine": engine.engine_pids}), flush=True)
    await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
