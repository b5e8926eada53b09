"""The route of ``sb add-task``'s learner argument from the command line to the store's commit (tests/route.py
says which frames count): it goes through the layers without going back and forth between them."""

import shutil

from typer.testing import CliRunner

from route import trace
from sbcli.cli.app import app

MOST_RETURNS = 35  # returns into a module already left, CLI to commit (docs/lab/architecture.md)


def test_add_task_reaches_the_commit_with_few_returns_into_a_module_already_left(one_task_learner, color_data,
                                                                                tmp_path):
    learner = tmp_path / "learner"
    shutil.copytree(one_task_learner, learner)
    args = ["add-task", str(learner), str(color_data["task2_train"]), "--test", str(color_data["task2_test"]),
            "--device", "cpu"]
    outcome = []
    route = trace(learner, lambda: outcome.append(CliRunner().invoke(app, args)))
    assert outcome[0].exit_code == 0, outcome[0].output
    assert route.committed and route.entered[0].startswith("sbcli.cli.")
    print(f"\n{route.returns} returns into a module already left, {len(route.entered)} modules entered")
    for (left, into), n in route.back.most_common():
        print(f"{n:4d}  {left} -> {into}")
    assert route.returns <= MOST_RETURNS
