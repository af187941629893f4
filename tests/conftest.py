import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture
def every_form_fuses(monkeypatch):
    """The choice of target without the choice of form after it: every block fused where the target
    leaves it open, as on a machine where each fused form beats the original ops at every length.
    For tests of what is chosen and reported per target; tests/test_forms.py pins the forms."""
    from ortflash.pipeline import forms

    monkeypatch.setattr(forms, "choose", lambda *args, **kw: forms.FormChoice(True, ""))


# The CPU class whose cost table decides where a test leaves it open: the suite's expectations are
# the AVX2 table's on every CI machine, whichever class it is (tests/test_forms.py pins each class).
PINNED_CPU_CLASS = "avx2"


@pytest.fixture(autouse=True)
def pinned_cpu_class(monkeypatch):
    """optimize() without cpu_class reads the table of the running machine's kernel build: pinned
    here, so a test's choice of form does not depend on the CI machine's vector unit."""
    from ortflash.pipeline import forms

    monkeypatch.setattr(forms, "running_cpu_class", lambda: PINNED_CPU_CLASS)
    return PINNED_CPU_CLASS
