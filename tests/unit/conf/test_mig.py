from __future__ import annotations

import pytest

from gpuhpc.spec.gpus import check_mig_layout, gpu_model


@pytest.mark.parametrize(("gpu", "layout"), [
    ("h100", ["1g.10gb"] * 7),
    ("h100", ["3g.40gb", "3g.40gb"]),
    ("h100", ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]),
    ("h100", ["4g.40gb", "3g.40gb"]),
    ("h100-80gb", ["7g.80gb"]),
    ("a100-80gb", ["2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb"]),
    ("a100-40gb", ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"]),
    ("h200", ["1g.18gb"] * 7),
    ("h200", ["3g.71gb", "4g.71gb"]),
    ("gh200", ["1g.24gb"] * 4),
    ("a30", ["2g.12gb", "1g.6gb", "1g.6gb"]),
])
def test_valid_layouts(gpu, layout):
    model = gpu_model(gpu)
    assert model is not None
    assert check_mig_layout(model, layout) is None


@pytest.mark.parametrize(("gpu", "layout", "why"), [
    ("h100", ["1g.10gb"] * 8, "at most 7"),
    ("h100", ["3g.40gb", "3g.40gb", "1g.10gb"], "memory slices"),
    ("h100", ["4g.40gb", "4g.40gb"], "at most 1"),
    ("h100", ["1g.20gb"] * 5, "at most 4"),
    ("h100", ["3g.20gb"], "not a MIG profile"),
    ("a100-40gb", ["3g.40gb"], "not a MIG profile"),
    ("h200", ["7g.80gb"], "not a MIG profile"),
    ("a100-80gb", ["4g.40gb", "2g.20gb", "2g.20gb"], "compute slices"),
    ("l40s", ["1g.10gb"], "does not support MIG"),
])
def test_invalid_layouts(gpu, layout, why):
    model = gpu_model(gpu)
    assert model is not None
    assert why in (check_mig_layout(model, layout) or "")
