"""The typed cycle record in engine/trace.py is what the engine writes and what the loader checks."""
import pytest

from engine.config import SpecSettings
from engine.speculative import speculative_generate
from engine.trace import CYCLE_FIELDS, NUM, CycleRecord
from tests.test_prompt_lookup import lookup_pair
from tests.tiny import noisy_pair


def test_loader_table_is_derived_from_the_typed_record():
    assert list(CYCLE_FIELDS) == [k for k in CycleRecord.__annotations__ if k in CycleRecord.__required_keys__]
    assert CYCLE_FIELDS["rejected_position"] == (int, None)
    assert CYCLE_FIELDS["draft_cache_len"] == (dict, None)
    assert CYCLE_FIELDS["cycle_time_s"] == NUM
    assert "drafter_state" not in CYCLE_FIELDS and "drafter_state" in CycleRecord.__optional_keys__


@pytest.mark.parametrize("make_pair, extra", [(lambda: noisy_pair(0), set()), (lambda: lookup_pair(0), {"drafter_state"})],
                         ids=["model", "prompt-lookup"])
def test_engine_writes_exactly_the_typed_fields(make_pair, extra):
    for rec in speculative_generate(make_pair(), [1, 2, 4, 1, 2], SpecSettings(k=3, temperature=0, max_new_tokens=8)):
        assert set(rec) == set(CYCLE_FIELDS) | extra
