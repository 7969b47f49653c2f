"""The README's Python API example runs as written (outside the repository, on the shipped model) and does what its
comments say: text streams, a bad live setting raises at once, the run is summarised and its trace exported."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readmes_python_example_runs(tmp_path):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Python API", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert 'Path("traces")' in code
    code += ("\nimport pytest\nwith pytest.raises(Exception, match='tau_approx'):\n"
             "    run.update_settings({'tau_approx': 7})\n"
             "print('\\nexported:', sorted(p.name for p in Path('traces').iterdir()))\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"modeled: TPOT \d+\.\d+ ms, hit rate \d\.\d\d", r.stdout), r.stdout[-500:]
    assert "exported: ['spice-" in r.stdout and ".trace.json" in r.stdout, r.stdout[-500:]
