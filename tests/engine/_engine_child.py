"""Helper process for test_vllm_lifecycle: two small engines, A and B.

Prints `ENGINE-CHILD-READY {json}` once both are up (vLLM logs to stdout too,
hence the marker). Then, for each line "generate" on stdin, asks engine B for
a completion and prints `ENGINE-CHILD-RESULT <outcome>`. Idles until killed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

READY = "ENGINE-CHILD-READY "
RESULT = "ENGINE-CHILD-RESULT "


async def main(model_path: str) -> None:
    from ncp_local.engines.base import EngineDead, Message, Request
    from ncp_local.engines.settings import ModelSettings
    from ncp_local.engines.vllm import VLLMEngine

    def cfg(name: str) -> ModelSettings:
        return ModelSettings(
            name=name, path=model_path, max_model_len=512, kv_cache_memory_bytes=128 << 20, max_num_seqs=2,
            enforce_eager=True,
        )

    req = Request(messages=(Message("user", "Hi"),), temperature=0.0, top_p=1.0, max_tokens=2, seed=0)
    a = await VLLMEngine.start(cfg("child-a"))
    b = await VLLMEngine.start(cfg("child-b"))
    await a.generate(req)
    await b.generate(req)
    info = {"pid": os.getpid(), "a": a.engine_pids, "b": b.engine_pids}
    print(READY + json.dumps(info), flush=True)

    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            await asyncio.sleep(3600)
            continue
        try:
            c = await asyncio.wait_for(b.generate(req), 60)
            outcome = f"ok {c.finish_reason}"
        except EngineDead as e:
            outcome = f"EngineDead {e}"
        except asyncio.TimeoutError:
            outcome = "timeout"
        except Exception as e:  # report anything else as it is
            outcome = f"{type(e).__name__} {e}"
        print(RESULT + outcome.replace("\n", " "), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
