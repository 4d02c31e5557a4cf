"""A thin shim: the metadata lives in pyproject.toml. It only lists the packages, because preprocess/
installs as ``bet_fairseq.preprocess`` (no generic top-level name), which pyproject's find cannot map."""

from setuptools import find_packages, setup

setup(packages=find_packages(include=["bet_fairseq", "bet_fairseq.*"]) + ["bet_fairseq.preprocess"])
