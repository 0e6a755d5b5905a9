"""`launch --follow` / `resume --follow` exit with a code per end state, so scripts can tell them apart."""

from __future__ import annotations

from helpers import REPO

from orchestrator.cli.follow import FOLLOW_EXIT_CODES


def test_each_end_state_has_its_own_documented_exit_code() -> None:
    assert FOLLOW_EXIT_CODES["SUCCEEDED"] == 0
    codes = [FOLLOW_EXIT_CODES[s] for s in ("FAILED", "CANCELLED", "STOPPED")]
    assert len(set(codes)) == 3 and 0 not in codes and 1 not in codes and 2 not in codes
    readme = (REPO / "README.md").read_text()
    for state, code in FOLLOW_EXIT_CODES.items():
        assert f"{code} {state}" in readme, state
