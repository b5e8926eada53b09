"""The help states every default a run uses, per source; methods own their options, plan and inference rules."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from sbcli.cli.app import app
from sbcli.config.options import bench_defaults, build_options
from sbcli.defaults import DEFAULTS, KIND_WORDS, show
from sbcli.methods import METHODS, build_config

SOURCES = {"folder": "photos", "demo": None, "paper": "cifar100"}


def params(command: str) -> dict:
    """The options of ``command`` as the user's help shows them (name -> click parameter)."""
    return {p.name: p for p in typer.main.get_command(app).commands[command].params}


def stated(help_text: str) -> str:
    match = re.search(r"\(default: (.*)\)\.$", help_text)
    assert match, f"no default stated in: {help_text}"
    return match.group(1)


def per_source(statement: str, command: str) -> dict[str, str]:
    """``30 for folders, 8 for the demo, 200 for paper benchmarks`` -> {"folder": "30", ...}."""
    kinds = ("folder", "demo", "paper") if command == "train" else ("paper", "demo")
    if command == "bench" and "; " in statement:
        paper, demo = statement.split("; ")
        return {"paper": paper, "demo": demo.removesuffix(" for the demo")}
    if " for " not in statement or statement.startswith("--"):
        return dict.fromkeys(kinds, statement)
    found = {}
    for part in statement.split(", "):
        value, _, who = part.partition(" for ")
        for kind, words in KIND_WORDS.items():
            if words in who.split(" and "):
                found[kind] = value
    assert set(found) == set(kinds), statement
    return found


def used(command: str, source: str | None) -> dict:
    """Every setting a run of ``command`` on ``source`` uses when no option is given."""
    # a folder's column is its run from scratch; with no backbone asked it starts from EfficientNet-Lite0 instead
    # (the --pretrained help; tests/test_folder_default.py)
    given = {"source": source, "recipe": None, "pretrained": "none" if command == "train" and source == "photos" else None}
    defaults = None if command == "train" else {k: v for k, v in bench_defaults(source).items() if k != "tasks"}
    seq, run, _ = build_options(given, defaults)
    values = {**dataclasses.asdict(build_config(run.method, run.method_options)), **dataclasses.asdict(run.train),
              **{f.name: getattr(run, f.name) for f in dataclasses.fields(run)}, **dataclasses.asdict(seq)}
    values["tasks"] = seq.tasks
    return values


@pytest.mark.parametrize("command", ["train", "bench"])
def test_every_option_of_the_table_states_the_default_a_run_uses_for_each_source(command):
    options = params(command)
    checked = 0
    for name, row in DEFAULTS.items():
        if name not in options or (command == "bench" and name == "tasks"):
            continue
        expected = per_source(stated(options[name].help), command)
        for kind, source in SOURCES.items():
            if kind not in expected:
                continue
            values = used(command, source)
            if name not in values:  # a method option that the method this source runs does not take
                continue
            value = values[name]
            if row.text is not None and expected[kind] == row.text:
                assert value == row.value, (name, kind)  # the sentinel the text explains
            else:
                assert expected[kind] == show(value), (command, name, kind, expected[kind], value)
            checked += 1
    assert checked >= 3 * 25 if command == "train" else checked >= 2 * 25


def test_the_help_states_the_own_data_defaults_it_used_to_misstate():
    options = params("train")
    assert stated(options["balance_epochs"].help) == "0 for folders, 2 for the demo and paper benchmarks"
    assert stated(options["epochs"].help) == "30 for folders, 8 for the demo, 200 for paper benchmarks"
    assert stated(params("bench")["balance_epochs"].help) == "0"
    assert "the learner's own" in params("add-task")["balance_epochs"].help


def test_every_method_option_states_each_methods_default():
    options = params("train")
    for method in METHODS.names():
        cfg = build_config(method, {})
        for f in dataclasses.fields(cfg):
            name = f.metadata.get("together") or f.name
            statement = stated(options[name].help)
            parts = dict(p.rsplit(" for ", 1)[::-1] for p in statement.split("; ")) if " for " in statement else {}
            text = next((v for k, v in parts.items() if method in k.split(", ")), statement)
            if name in DEFAULTS:  # a method option whose default the table sets per source (checked above)
                continue
            if f.metadata.get("default_text") is None and not f.metadata.get("together"):
                assert text == show(getattr(cfg, f.name)), (method, f.name, text)
            elif f.default is None and f.name != "gamma":
                assert getattr(cfg, f.name) is None  # "--epochs": the run's own value
    assert stated(options["gamma"].help) == "1 with --sparsity code, 0.0115 with paper"
    assert build_config("sb", {}).gamma == 1.0 and build_config("sb", {"sparsity": "paper"}).gamma == 0.0115


def test_every_method_field_is_an_option_with_its_help():
    options = params("train")
    for method in METHODS.names():
        for f in dataclasses.fields(METHODS.get(method).config):
            assert f.metadata.get("help") is not None, f"{method}.{f.name} has no help"
            assert (f.metadata.get("together") or f.name) in options


def test_each_method_names_its_inference_rules_and_refuses_the_others():
    for method in METHODS.names():
        spec = METHODS.get(method)
        assert build_config(method, {}).inference in spec.inferences
        for rule in spec.inferences:
            assert build_config(method, {"inference": rule}).inference == rule
        for rule in {"wa", "none", "bic", "icarl"} - set(spec.inferences):
            with pytest.raises(Exception, match="--inference"):
                build_config(method, {"inference": rule})


def test_the_methods_are_read_without_torch():
    code = ("import sys; import sbcli.methods, sbcli.methods.options, sbcli.defaults; "
            "sbcli.methods.options.method_options(); assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_command_reference_shows_the_table_and_the_method_options_as_generated():
    import sbcli.defaults
    import sbcli.methods.options

    text = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text(encoding="utf-8")
    for start, end, generated in (("<!-- defaults:", "<!-- end of defaults -->", sbcli.defaults.markdown()),
                                  ("<!-- method options:", "<!-- end of method options -->",
                                   sbcli.methods.options.markdown())):
        shown = text[text.index(start):text.index(end)].split("\n", 1)[1].strip()
        assert shown == generated, f"docs/cli.md is out of date; paste:\n{generated}"


NEW_METHOD = '''
from dataclasses import dataclass

from sbcli.methods.base import INFERENCE_HELP, TaskContext, TaskResult, option, register_method
from sbcli.methods.rules import InferenceRule, register_rule

register_rule(InferenceRule("newrule", "the new method's own scores", "its own scores"))


@dataclass(frozen=True)
class Config:
    RULES = ("newrule", "none")
    inference: str = option("newrule", INFERENCE_HELP)
    first_task_rules: bool = option(True, "Step 1 keeps the head bias at zero.")
    shrink: float = option(0.5, "How much the new method shrinks.")


def plan(cfg, epochs, num_old, num_total):
    return 3 * epochs


@register_method("newone", Config, "a method added in one file", plan=plan)
def learn_task(ctx: TaskContext, cfg: Config) -> TaskResult:
    return TaskResult()
'''


def test_a_method_in_one_new_file_brings_its_options_plan_and_rules(tmp_path):
    (tmp_path / "newone.py").write_text(NEW_METHOD, encoding="utf-8")
    code = ("import sys, newone, typer.main; from sbcli.cli.app import app; from sbcli.run.plan import sequence_epochs; "
            "p = {q.name: q for q in typer.main.get_command(app).commands['train'].params}; "
            "print(p['shrink'].help); print(sequence_epochs('newone', {}, 2, [1, 1, 1])); "
            "print('torch' in sys.modules); print(p['inference'].help)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": f"{tmp_path}:{Path(__file__).resolve().parents[1]}"})
    assert out.stdout.split("\n")[:3] == ["newone: How much the new method shrinks (default: 0.5).", "[2, 6, 6]", "False"]
    assert "newrule (the new method's own scores)" in out.stdout.split("\n")[3]  # its own rule, from its own file
    assert "newone takes newrule" in out.stdout.split("\n")[3].replace(" or ", ", ")


def test_the_inference_help_names_every_offered_rule_with_no_list_to_keep(monkeypatch):
    from sbcli.methods.rules import RULES, rules_help
    from sbcli.methods.rules.rule import InferenceRule

    offered = [RULES.get(name) for name in RULES.names() if RULES.get(name).offered]
    assert all(f"{r.name} ({r.summary})" in rules_help() for r in offered) and len(offered) >= 7
    monkeypatch.setitem(RULES._items, "zzz-new", InferenceRule("zzz-new", "a rule added by one file", "card"))
    assert "zzz-new (a rule added by one file)" in rules_help()  # registered is listed
