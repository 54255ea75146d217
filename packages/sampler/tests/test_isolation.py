"""tokenloom.sampler pulls in only tokenloom.formats (for the errors), never tokenloom.datasets."""

import subprocess
import sys

PROGRAM = "import sys, tokenloom.sampler; print(' '.join(m for m in sys.modules if m[:10] == 'tokenloom.'))"


def test_importing_the_sampler_loads_no_other_tokenloom_package() -> None:
    result = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120, check=True)
    packages = {name.split(".")[1] for name in result.stdout.split()}
    assert packages == {"sampler", "formats"}
