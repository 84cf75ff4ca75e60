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


#: The specs whose Triton module is kept too, one per class with a Triton kernel (the rest of
#: such a module is the PyTorch backend's, kept above).
TRITON = ["gated_retention", "gated_deltanet", "gla", "kda"]
CASES = [pytest.param(p, "pytorch", id=p.stem) for p in SPECS] + [
    pytest.param(ROOT / "specs" / f"{name}.mix", "triton", id=f"triton-{name}") for name in TRITON
]


@pytest.mark.parametrize(("path", "backend"), CASES)
def test_generated_source_matches_golden(path, backend):
    source = Source(path.read_text(encoding="utf-8"), f"specs/{path.name}")
    text = mixc.compile_source(source, backend)
    folder = Path(__file__).parent / "golden"
    golden = (folder if backend == "pytorch" else folder / backend) / f"{path.stem}.py"
    if os.environ.get("MIXC_UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text, encoding="utf-8")
    assert golden.is_file(), f"no golden file; run MIXC_UPDATE_GOLDEN=1 python -m pytest {__file__}"
    assert text == golden.read_text(encoding="utf-8"), (
        f"generated source of {path.name} changed; if intended, regenerate with "
        "MIXC_UPDATE_GOLDEN=1 python -m pytest tests/backends/test_golden.py and review the diff"
    )
