"""`make bench` keeps working: the benchmark driver at its smallest sizes, figures checked for sense."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_run_all_at_the_smallest_sizes_prints_and_writes_every_figure(tmp_path: Path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run_all.py"), "--cycle-sizes", "0", "--cycle-policies", "fifo,dike",
         "--repeat", "1", "--replay-sizes", "3000", "--replay-policies", "fifo", "--results", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    document = json.loads((tmp_path / "run_all.json").read_text())
    (cycle,) = document["cycle"]
    assert cycle["pending"] == 1000 and cycle["floor_s"] > 0
    for name in ("fifo", "dike"):
        first, steady = cycle["policies"][name], cycle["policies"][name]["steady"]
        running = cycle["policies"][name]["steady_running"]
        assert first["writes"] >= 1000 and steady["writes"] == running["writes"] == 0  # Slurm holds every value
        minute = cycle["policies"][name]["minute_later"]  # the clock moved: fifo's order did not, Dike's may have
        assert minute["cycle_s"] > 0 and minute["apply_s"] > 0 and (minute["writes"] == 0 or name != "fifo")
        assert 0 < first["decide_s"] < first["cycle_s"] and first["ratio_to_floor"] > 1
    (replay,) = document["replay"]
    assert replay["policy"] == "fifo" and replay["jobs"] > 2000 and replay["events"] > replay["jobs"]
    assert replay["floor_s"] > 0 and replay["ratio_to_floor"] > 1 and 0 < replay["peak_rss_mb"] < 2048
    assert (tmp_path / "cycle.png").stat().st_size > 1000 and (tmp_path / "replay.png").stat().st_size > 1000
    assert "Engine cycle without Slurm I/O" in proc.stdout and "a minute later" in proc.stdout and "Fitted exponents" in proc.stdout
