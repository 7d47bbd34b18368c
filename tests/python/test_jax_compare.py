"""benchmarks/jax_compare.py end to end on a small pytree: every variant saves, restores bit
for bit, and the run writes its JSON and table with the ratios against Orbax's."""

import json
import subprocess
import sys

import pytest

pytest.importorskip("jax")
pytest.importorskip("orbax.checkpoint")

from conftest import SOURCE_DIR

BENCH = SOURCE_DIR / "benchmarks" / "jax_compare.py"


def test_compares_the_three_variants_on_one_pytree_and_writes_the_table(tmp_path):
    out = tmp_path / "results"
    subprocess.run([sys.executable, str(BENCH), "--gib", "0.01", "--repeats", "2", "--out",
                    str(out), "--dir", str(tmp_path / "scratch")], check=True,
                   capture_output=True, text=True, timeout=600)
    (result,) = out.glob("jax_compare-*.json")
    rows = json.loads(result.read_text())["rows"]
    assert [row["variant"] for row in rows] == ["orbax-standard", "asyncckpt-jax",
                                                "asyncckpt-orbax-handler"]
    for row in rows:
        assert row["exact"], row["variant"]
        assert len(row["blocked"]) == len(row["restore"]) == 2
        assert min(row["bytes"]) > 0 and row["peak_rss"] >= row["rss_with_state"]
        assert all(b <= d for b, d in zip(row["blocked"], row["durable"]))
    table = result.with_suffix(".md").read_text()
    assert table.count("| asyncckpt-") == 2 and "x) |" in table
