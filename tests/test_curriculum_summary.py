"""recipes/curriculum/summarize.py's interval for the one-seed steering pilot, by hand."""

from __future__ import annotations

import importlib.util

from tests.conftest import REPO


def _summarize():
    spec = importlib.util.spec_from_file_location("summarize", REPO / "recipes" / "curriculum" / "summarize.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_welch_difference_of_design_means_with_the_conservative_t():
    welch = _summarize().welch
    # means 0.3 and 0.2; variances 0.02 and 0.04; se = sqrt(0.02/2 + 0.04/3) = 0.15275; t(1) = 12.706
    assert welch([0.2, 0.4], [0.0, 0.2, 0.4]) == "+0.100 ± 1.941 (designs 2, 3)"
    # means 0.25 and 0.58; se = sqrt(0.016667/4 + 0.007/5) = 0.07461; df = min(n) - 1 = 3, t = 3.1824
    a, b = [0.1, 0.2, 0.3, 0.4], [0.5, 0.5, 0.6, 0.6, 0.7]
    assert welch(a, b) == "-0.330 ± 0.237 (designs 4, 5)"
    assert welch([0.5], b) == "n/a" and welch(a, []) == "n/a"  # no variance from one design
