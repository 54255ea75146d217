"""tokenloom.hf_streaming loads only the packages it declares, and no tokenizer or HF datasets at import."""

import os
import subprocess
import sys

import pytest

PROGRAM = (
    "import sys, tokenloom.hf_streaming; "
    "print(' '.join(m for m in sys.modules "
    "if m[:10] == 'tokenloom.' or m in ('tokenizers', 'datasets', 'transformers')))"
)


def test_import_loads_only_declared_packages_and_no_tokenizer() -> None:
    result = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120, check=True)
    loaded = set(result.stdout.split())
    packages = {name.split(".")[1] for name in loaded if name.startswith("tokenloom.")}
    assert packages <= {"hf_streaming", "formats", "datasets", "sampler"}
    assert "hf_streaming" in packages
    assert not loaded & {"tokenizers", "datasets", "transformers"}


def test_isolated_env_lacks_undeclared_tokenloom_packages() -> None:
    if os.environ.get("TOKENLOOM_ISOLATED_ENV") != "hf-streaming":
        pytest.skip("checks the tox env that installs only tokenloom-hf-streaming")
    import importlib.util

    # tokenloom.tokenize is installed: tokenloom-datasets[hf] depends on it (its engine selection
    # encodes HuggingFaceDataset's cache), so it is no longer an undeclared package here
    assert importlib.util.find_spec("tokenloom.tokenize") is not None
    assert importlib.util.find_spec("tokenloom.curriculum") is None
