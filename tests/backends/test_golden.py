"""The generated source of every shipped spec, byte for byte. An intended codegen change is
accepted by regenerating: MIXC_UPDATE_GOLDEN=1 python -m pytest tests/backends/test_golden.py"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import mixc
from mixc.errors import Source

ROOT = Path(__file__).parents[2]
SPECS = sorted(ROOT.glob("specs/*.mix"))


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_generated_source_matches_golden(path):
    text = mixc.compile_source(Source(path.read_text(encoding="utf-8"), f"specs/{path.name}"))
    golden = Path(__file__).parent / "golden" / f"{path.stem}.py"
    if os.environ.get("MIXC_UPDATE_GOLDEN"):
        golden.write_text(text, encoding="utf-8")
    assert golden.is_file(), f"no golden file; run MIXC_UPDATE_GOLDEN=1 python -m pytest {__file__}"
    assert text == golden.read_text(encoding="utf-8"), (
        f"generated source of {path.name} changed; if intended, regenerate with "
        "MIXC_UPDATE_GOLDEN=1 python -m pytest tests/backends/test_golden.py and review the diff"
    )
