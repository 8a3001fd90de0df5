"""ncp-local entry point: `python run.py [group=option ...] [key=value ...]`.

Modes: run (default), lint. See README.md.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from ncp_local.config import REPO_ROOT

OmegaConf.register_new_resolver("repo_root", lambda: str(REPO_ROOT), replace=True)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from ncp_local.cli import main as cli_main

    code = cli_main(cfg)
    if code:
        sys.exit(code)


# vLLM starts its engine in a spawned process, which re-imports this module.
if __name__ == "__main__":
    main()
