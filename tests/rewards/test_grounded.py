"""rewards/grounded.py: an answer is a success only when right and looked up."""

from __future__ import annotations

from art_langgraph import Trajectory
from art_langgraph.rewards import check_answer, mentions
from art_langgraph.trajectories.trajectory import ToolEvent


def _episode(*results: object, error: str | None = None) -> Trajectory:
    traj = Trajectory()
    for r in results:
        traj.add_tool_event(ToolEvent(name="lookup", result=r, error=error))
    return traj


def test_a_right_answer_counts_only_when_a_tool_result_held_it() -> None:
    looked = check_answer("It is 4821.", "4821", _episode("Ann Bell's extension: 4821."))
    assert looked.right and looked.looked_up and looked.success
    recalled = check_answer("Paris", "Paris", _episode())
    assert recalled.right and not recalled.success and recalled.right_without_lookup
    failed = check_answer("4821", "4821", _episode(None, error="no such person"))
    assert not failed.looked_up and not failed.success
    # JSON results are searched as their text
    assert check_answer("4821", "4821", _episode({"extension": 4821})).success


def test_an_answer_naming_several_candidates_is_not_right() -> None:
    traj = _episode("Ann Bell's extension: 4821.")
    hedged = check_answer("4821 or 5532", "4821", traj, candidates=["4821", "5532", "7710"])
    assert not hedged.right and not hedged.success and hedged.looked_up
    assert check_answer("4821", "4821", traj, candidates=["4821", "5532"]).success


def test_mentions_match_whole_words_in_any_case() -> None:
    assert mentions("the capital is PARIS.", "Paris")
    assert not mentions("Parisian", "Paris") and not mentions("14821", "4821")
    assert not mentions("anything", "")
