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
