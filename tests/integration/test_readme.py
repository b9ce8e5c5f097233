"""The README's API example runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_api_example_runs(tmp_path: Path) -> None:
    """The first python block of the README executes and its assertions hold."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README lost its API example"
    script = tmp_path / "example.py"
    script.write_text(blocks[0])
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
