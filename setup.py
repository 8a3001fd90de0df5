"""The wheel's file list; the metadata is pyproject.toml's.

conf/, prompts/ and specs/ stay at the top of the repository and ship inside the package as
ncp_local/conf, ncp_local/prompts and ncp_local/specs (ncp_local/resources.py finds either place).
pyproject.toml alone cannot say this: its `packages.find` cannot be combined with a `package-dir`
mapping of folders that are not below the package, and a hand-kept package list would go stale.
An editable install (`pip install -e .`, the Makefile's) maps the same names onto the clone's own
folders, where resources.py finds them anyway.
"""

from setuptools import find_namespace_packages, setup

BUNDLED = ("conf", "prompts", "specs")  # ncp_local/resources.py's BUNDLED
DATA_FILES = ["*.yaml", "*.txt"]  # all that the three folders hold (tests/test_wheel.py checks)
# Each folder of the three, and each folder inside them (conf/model, specs/specs...), as a package of
# data: setuptools copies a folder's files only for a package it is told of.
DATA_PACKAGES = [
    f"ncp_local.{name}{'.' + sub if sub else ''}"
    for name in BUNDLED
    for sub in ("", *find_namespace_packages(where=name, exclude=["*.__pycache__"]))
]

setup(
    # hydra_plugins/ is Hydra's namespace for launchers (the batched one: conf/hydra/launcher/batched.yaml).
    packages=[
        *find_namespace_packages(include=["ncp_local", "ncp_local.*", "hydra_plugins.*"], exclude=["*.__pycache__"]),
        *DATA_PACKAGES,
    ],
    package_dir={f"ncp_local.{name}": name for name in BUNDLED},
    package_data={
        # The HTML report's stylesheet and scripts (ncp_local/report/assets.py reads them as package files), and the
        # paper's published figures (report/paper.py).
        "ncp_local.report": ["assets/*.css", "assets/*.js", "paper_figures.yaml"],
        **dict.fromkeys(DATA_PACKAGES, DATA_FILES),
    },
)
