"""Every case of the fault table behaves as docs/faults.md says (run `python tests/faults/fault_table.py` for the
table itself)."""

import pytest
from fault_table import CASES, format_table, run_case


@pytest.mark.parametrize("case", CASES, ids=[c.__name__.removeprefix("case_") for c in CASES])
def test_fault_case(case):
    name, outcome, ok = run_case(case)
    print(format_table([(name, outcome, ok)]))
    if outcome.startswith("skipped: "):
        pytest.skip(outcome)
    assert ok, outcome
