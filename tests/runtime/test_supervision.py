import pytest

from pbkv.runtime import RestartBudget, Strategy


def test_strategy_parses_names_and_lists_known_ones():
    assert Strategy.parse("restart") is Strategy.RESTART
    assert Strategy.parse(Strategy.STOP) is Strategy.STOP
    with pytest.raises(ValueError, match="known strategies: 'restart', 'stop', 'escalate'"):
        Strategy.parse("retry")


def test_budget_allows_n_restarts_per_window():
    budget = RestartBudget(max_restarts=2, within_s=10.0)
    assert [budget.try_consume(t) for t in (0.0, 1.0, 2.0)] == [True, True, False]
    assert budget.in_window(2.0) == 2


def test_budget_window_slides():
    budget = RestartBudget(max_restarts=2, within_s=10.0)
    assert budget.try_consume(0.0)
    assert budget.try_consume(5.0)
    assert not budget.try_consume(9.9)
    assert budget.try_consume(10.0)  # the restart at 0.0 left the window (0.0, 10.0]
    assert budget.in_window(10.0) == 2
    assert budget.in_window(30.0) == 0


def test_zero_budget_refuses_the_first_restart():
    assert not RestartBudget(max_restarts=0, within_s=1.0).try_consume(0.0)


@pytest.mark.parametrize(
    ("max_restarts", "within_s", "argument"), [(-1, 1.0, "max_restarts"), (1, 0.0, "within_s")]
)
def test_budget_rejects_bad_arguments(max_restarts, within_s, argument):
    with pytest.raises(ValueError, match=argument):
        RestartBudget(max_restarts, within_s)


def test_budget_describes_itself():
    assert RestartBudget(2, 60.0).describe() == "2 restarts within 60.0 s"
