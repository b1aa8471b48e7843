"""docs/nki.md's tutorial, executed as written: its ```python blocks, in order, as one script."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_nki_tutorial_runs_as_documented(tmp_path):
    doc = (ROOT / "docs" / "nki.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.DOTALL)
    assert len(blocks) >= 5
    script = tmp_path / "tutorial.py"
    script.write_text("\n".join(blocks))
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, check=False,
                         timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "rmsnorm matches numpy" in text
    assert re.search(r"\d+ instructions, [\d.]+ us simulated", text)
    line = next(i + 1 for i, s in enumerate(script.read_text().splitlines()) if "return nl.load(x)" in s)
    assert f"tutorial.py:{line}: Size of partition dimension 300 exceeds architecture limitation of 128" in text
    assert re.search(r"p50 latency \(us\): [\d.]+", text)
    assert "'line': 'tutorial.py:" in text
    assert re.search(r"\[\('nki\.rmsnorm_[0-9a-f]{10}\.default', 'nki'\)\]", text)
