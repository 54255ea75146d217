"""tokenloom.curriculum pulls in formats, datasets and sampler, and no other tokenloom package."""

import subprocess
import sys

# `import *` resolves every lazy export (a bare `import tokenloom.curriculum` loads no dataset, on purpose)
PROGRAM = (
    "import sys; from tokenloom.curriculum import *; print(' '.join(m for m in sys.modules if m[:10] == 'tokenloom.'))"
)


def test_importing_the_curriculum_loads_only_its_declared_tokenloom_packages() -> None:
    result = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120, check=True)
    packages = {name.split(".")[1] for name in result.stdout.split()}
    assert packages == {"curriculum", "formats", "datasets", "sampler"}
