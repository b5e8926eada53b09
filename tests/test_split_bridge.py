"""Split-and-Bridge as a method (docs/method.md §5): the phases, what each leaves behind, the records,
the recipes of the paper, and an end-to-end `sb train --method sb` + `sb add-task` on real images."""

from __future__ import annotations

import copy
import inspect
import io
import json
from pathlib import Path

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from sbcli.cli import render
from sbcli.cli import train as train_cmd
from sbcli.cli.app import app
from sbcli.config import options
from sbcli.config.options import defaults_for
from sbcli.config.recipes import list_recipes, load_recipe
from sbcli.data.device import DeviceData, Normalization
from sbcli.engine.loop import Engine, Phase, StepOutputs, TrainConfig
from sbcli.errors import ConfigError
from sbcli.learner.records import StepRecord
from sbcli.methods import TaskContext, build_config
from sbcli.methods.losses import ce_loss, kd_loss
from sbcli.methods.rules.stages import record_json
from sbcli.methods.split_bridge import Config, bridge_loss, learn_task, separated_loss
from sbcli.methods.teachers import frozen_copy
from sbcli.metrics import StepMetrics, step_metrics
from sbcli.nets import create_model
from sbcli.nets.partition import cross_mask, cross_norm, disconnect, enforce_masks, make_partition, sparsity_paper
from sbcli.nets.resnet import IncrementalResNet

NUM_OLD, NUM_NEW = 3, 2
ZOO_RECIPES = Path(__file__).resolve().parents[1] / "zoo" / "recipes"


pytestmark = pytest.mark.usefixtures("one_thread")


class SpyEngine(Engine):
    """The real engine, plus a look at the model (and teacher) just before and after each phase."""

    def __init__(self, *args, probe: torch.Tensor, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.probe = probe
        self.seen: list[dict] = []

    def run(self, model: torch.nn.Module, data: DeviceData, phase: Phase):
        model.eval()
        start = {"phase": phase.name, "teacher": phase.teacher, "out": model(self.probe).detach(),
                 "teacher_out": None if phase.teacher is None else phase.teacher.eval()(self.probe).detach(),
                 "masks": [layer.module.mask is not None for layer in model.partitioned_layers()],
                 "bn": copy.deepcopy([bn.state_dict() for bn in model.split_batchnorms()]),
                 "stage3_bn": copy.deepcopy(model.stages[2][1].bn2.state_dict()),
                 "weights": {k: v.detach().clone() for k, v in model.state_dict().items()}}
        report = super().run(model, data, phase)
        start["end_bias"] = model.head.bias.detach().clone()
        start["end_bn"] = copy.deepcopy([bn.state_dict() for bn in model.split_batchnorms()])
        self.seen.append(start)
        return report


def random_data(num_classes: int, per_class: int, size: int = 16, seed: int = 0) -> DeviceData:
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(num_classes).repeat_interleave(per_class)
    images = torch.randint(0, 256, (len(labels), 3, size, size), generator=gen, dtype=torch.uint8)
    return DeviceData(images, labels)


def make_ctx(engine: Engine, epochs: int = 1, arch: str = "resnet18") -> TaskContext:
    """Step 2 of a sequence: a (random) model of NUM_OLD classes grown by NUM_NEW, with its teacher."""
    torch.manual_seed(0)
    model = create_model(arch, NUM_OLD, 0.125)
    teacher = frozen_copy(model)
    model.expand_classes(NUM_NEW)
    test = random_data(NUM_OLD + NUM_NEW, 4, seed=1)

    def evaluate():
        return step_metrics(engine.logits(model, test.images), test.labels, [0] * NUM_OLD + [1] * NUM_NEW)

    return TaskContext(step=1, model=model, teacher=teacher, data=random_data(NUM_OLD + NUM_NEW, 8), num_old=NUM_OLD,
                       num_total=NUM_OLD + NUM_NEW, engine=engine, epochs=epochs, evaluate=evaluate)


def spy_engine(weight_decay: float = 5e-4) -> SpyEngine:
    probe = torch.randn(6, 3, 16, 16)
    return SpyEngine(TrainConfig(epochs=1, batch_size=8, weight_decay=weight_decay), torch.device("cpu"),
                     Normalization(), seed=0, probe=probe)


# --------------------------------------------------------------------------------------------
# Phase B keeps the cross weights at exactly zero
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("hooks", [(enforce_masks,), ()], ids=["with-enforce-masks", "mask-alone"])
def test_phase_b_optimiser_steps_leave_every_cross_weight_exactly_zero(hooks):
    engine = spy_engine(weight_decay=5e-2)  # a strong decay: any leak into the cross weights would show
    ctx = make_ctx(engine)
    part = make_partition(ctx.model, 1.0, NUM_OLD)
    disconnect(ctx.model, part)
    before = {l.name: l.module.weight.detach().clone() for l in ctx.model.partitioned_layers()}
    report = engine.run(ctx.model, ctx.data, Phase("B", separated_loss(NUM_OLD), 2, ctx.teacher, after_step=hooks))
    assert report.epochs == 2
    for layer in ctx.model.partitioned_layers():
        weight, mask = layer.module.weight.detach(), cross_mask(layer, part)
        assert torch.count_nonzero(weight * mask) == 0, layer.name
        assert not torch.equal(weight * (1 - mask), before[layer.name] * (1 - mask)), layer.name  # the rest learned


def test_enforce_masks_zeroes_what_an_optimiser_might_write():
    model = create_model("resnet18", 5, 0.125)
    part = make_partition(model, 1.0, 3)
    disconnect(model, part)
    with torch.no_grad():
        for layer in model.partitioned_layers():
            layer.module.weight.add_(1.0)
    assert cross_norm(model, part) > 0
    enforce_masks(model)
    assert cross_norm(model, part) == 0


# --------------------------------------------------------------------------------------------
# The whole step: phases, teachers, bridge, BN, records
# --------------------------------------------------------------------------------------------


def run_step(cfg: Config, arch: str = "resnet18") -> tuple[TaskContext, SpyEngine, object]:
    engine = spy_engine()
    ctx = make_ctx(engine, arch=arch)
    result = learn_task(ctx, cfg)
    return ctx, engine, result


def test_a_split_step_runs_a_b_c_with_the_right_teachers_and_records():
    cfg = Config(rho=1.0, epochs_a=1, epochs_b=2, epochs_c=1)
    ctx, engine, result = run_step(cfg)
    assert [(p.name, p.epochs) for p in result.phases] == [("A", 1), ("B", 2), ("C", 1)]
    a, b, c = engine.seen
    assert a["teacher"] is ctx.teacher and b["teacher"] is ctx.teacher  # model t-1
    assert c["teacher"] is not ctx.teacher and c["teacher"].num_classes == NUM_OLD + NUM_NEW  # the split model
    assert torch.all(a["end_bias"] == 0)  # phase A keeps the head bias at zero
    assert a["masks"] == [False] * len(a["masks"]) and all(b["masks"]) and not any(c["masks"])
    record = record_json(result.record, result.stages)
    assert record["partition"]["is_split"] and record["partition"]["bf"] == pytest.approx(0.6)
    assert record["cross_norm_before_disconnect"] > 0
    assert set(record["after_B"]) >= {"overall", "old", "new", "intra_old", "intra_new"}
    assert "overall" in record["after_C"] and "wa_factor" not in record  # the step's tail aligns, after C
    assert result.stages == [] and not result.accuracy_before_align  # after_C is the accuracy before aligning


def test_at_the_first_step_of_the_bridge_the_model_is_the_split_model():
    _, engine, _ = run_step(Config(rho=1.0, epochs_a=1, epochs_b=1, epochs_c=1))
    c = engine.seen[2]
    assert c["phase"] == "C"
    torch.testing.assert_close(c["out"], c["teacher_out"], rtol=0, atol=1e-6)
    b_end = engine.seen[1]
    assert not torch.equal(c["out"], b_end["out"])  # phase B did train: the comparison is not vacuous
    part = make_partition(c["teacher"], 1.0, NUM_OLD)
    assert cross_norm(c["teacher"], part) == 0  # and the bridge weights started from exactly zero


def test_bn_is_kept_by_default_and_reset_with_bn_reset():
    kept = run_step(Config(rho=1.0, epochs_a=1, epochs_b=1, epochs_c=1))[1].seen
    reset = run_step(Config(rho=1.0, epochs_a=1, epochs_b=1, epochs_c=1, bn_reset=True))[1].seen
    for kept_phase, end_of_previous in ((kept[1], kept[0]), (kept[2], kept[1])):
        for now, then in zip(kept_phase["bn"], end_of_previous["end_bn"], strict=True):
            assert torch.equal(now["running_mean"], then["running_mean"]) and torch.equal(now["weight"], then["weight"])
    for phase in (reset[1], reset[2]):  # at the disconnect and again at the bridge
        for bn in phase["bn"]:
            assert torch.all(bn["weight"] == 1) and torch.all(bn["bias"] == 0)
            assert torch.all(bn["running_mean"] == 0) and torch.all(bn["running_var"] == 1)
        assert not torch.all(phase["stage3_bn"]["running_mean"] == 0)  # stage 3 is shared: untouched
    assert any(not torch.all(bn["running_mean"] == 0) for bn in reset[1]["end_bn"])  # B trained them again


def test_resnet32_step_runs_the_three_phases():
    _, engine, result = run_step(Config(rho=1.0, epochs_a=1, epochs_b=1, epochs_c=1), arch="resnet32")
    assert [p.name for p in result.phases] == ["A", "B", "C"]
    assert result.record["partition"]["width"]["in"] == 8  # ResNet-32 at 1/8 width: 64 / 8 channels


def test_a_step_with_bf_1_is_not_split_and_learns_against_model_t_minus_1():
    ctx, engine, result = run_step(Config(rho=10.0, epochs_c=2))
    assert [(p.name, p.epochs) for p in result.phases] == [("C", 2)]
    assert engine.seen[0]["teacher"] is ctx.teacher
    assert not result.record["partition"]["is_split"] and result.record["partition"]["bf"] == 1.0
    assert "after_B" not in result.record and "cross_norm_before_disconnect" not in result.record
    assert "after_C" in result.record and result.stages == []


def test_phase_epochs_default_to_the_run_epochs():
    engine = spy_engine()
    ctx = make_ctx(engine, epochs=2)
    result = learn_task(ctx, Config(rho=1.0, epochs_b=1))
    assert [(p.name, p.epochs) for p in result.phases] == [("A", 2), ("B", 1), ("C", 2)]


# --------------------------------------------------------------------------------------------
# Losses of the phases
# --------------------------------------------------------------------------------------------


def outputs(model: IncrementalResNet, teacher_classes: int) -> StepOutputs:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(8, NUM_OLD + NUM_NEW, generator=gen)
    teacher = torch.randn(8, teacher_classes, generator=gen)
    targets = torch.tensor([0, 1, 2, 3, 4, 3, 4, 0])
    return StepOutputs(model, torch.zeros(8, 3, 4, 4), targets, logits, teacher)


def test_phase_a_loss_adds_gamma_times_the_penalty():
    model = create_model("resnet18", NUM_OLD + NUM_NEW, 0.125)
    part = make_partition(model, 1.0, NUM_OLD)
    out = outputs(model, NUM_OLD)
    plain = separated_loss(NUM_OLD)(out)
    with_penalty = separated_loss(NUM_OLD, sparsity_paper, 2.5, part)(out)
    new = out.targets >= NUM_OLD
    expected = kd_loss(out.logits[:, :NUM_OLD], out.teacher_logits) + ce_loss(out.logits[new, NUM_OLD:], out.targets[new] - NUM_OLD)
    torch.testing.assert_close(plain, expected)
    torch.testing.assert_close(with_penalty - plain, 2.5 * sparsity_paper(model, part))


def test_bridge_loss_distils_the_split_models_old_logits():
    out = outputs(create_model("resnet18", 5, 0.125), NUM_OLD + NUM_NEW)  # the split teacher has every class
    lam = NUM_OLD / (NUM_OLD + NUM_NEW)
    expected = lam * kd_loss(out.logits[:, :NUM_OLD], out.teacher_logits[:, :NUM_OLD]) + (1 - lam) * ce_loss(out.logits, out.targets)
    torch.testing.assert_close(bridge_loss(NUM_OLD, lam)(out), expected)


def test_config_refuses_bad_values():
    with pytest.raises(ConfigError, match="sparsity"):
        build_config("sb", {"sparsity": "l1"})
    with pytest.raises(ConfigError, match="rho"):
        build_config("sb", {"rho": 0.0})
    assert build_config("sb", {"rho": None, "gamma": 0.5}).gamma == 0.5


# --------------------------------------------------------------------------------------------
# The ablation table
# --------------------------------------------------------------------------------------------


def accuracy(overall: float) -> dict:
    """A phase's metrics as a step's record keeps them (only the accuracy over every class matters here)."""
    return {"overall": overall, "per_task": [overall]}


def ablation_step(n: int, overall: float, record: dict) -> StepRecord:
    """A step as the ablation table reads it: its number, its final accuracy and the method's record."""
    nan = float("nan")
    return StepRecord(n, 2 * n, StepMetrics(overall, [overall] * n, nan, nan, nan, nan), record=record)


def test_ablation_table_rows_per_incremental_step():
    def step(n, record):
        return ablation_step(n, 40.0 + n, record)

    history = [step(1, {}),
               step(2, {"after_B": accuracy(30.0), "after_C": accuracy(35.0), "wa_factor": 0.9,
                        "cross_norm_before_disconnect": 1.5}),
               step(3, {"after_C": accuracy(33.0), "wa_factor": 0.8}),  # bf = 1: not split
               step(4, {"after_B": accuracy(20.0), "after_C": accuracy(25.0)})]  # --inference none
    console = Console(file=io.StringIO(), width=200)
    console.print(render.ablation_table(history))
    rows = [line.strip("│ ").split() for line in console.file.getvalue().splitlines() if line.startswith("│")]
    rows = [[cell for cell in row if cell != "│"] for row in rows]
    assert rows == [["2", "30.00", "35.00", "42.00", "1.5000"], ["3", "-", "33.00", "43.00", "-"],
                    ["4", "20.00", "25.00", "-", "-"]]
    assert render.ablation_table([step(1, {}), step(2, {"before_wa": accuracy(1.0)})]) is None


def test_ablation_table_shows_the_balance_phase_apart_from_weight_aligning():
    history = [ablation_step(1, 90.0, {}),
               ablation_step(2, 60.0, {"after_B": accuracy(30.0), "after_C": accuracy(35.0), "wa_factor": 0.9,
                                       "before_balance": accuracy(51.5), "cross_norm_before_disconnect": 1.5})]
    console = Console(file=io.StringIO(), width=200)
    console.print(render.ablation_table(history))
    text = console.file.getvalue()
    rows = [[c for c in line.strip("│ ").split() if c != "│"] for line in text.splitlines() if line.startswith("│")]
    assert "+balance" in text and rows == [["2", "30.00", "35.00", "51.50", "60.00", "1.5000"]]


# --------------------------------------------------------------------------------------------
# Recipes: the paper's settings
# --------------------------------------------------------------------------------------------

PAPER = {("cifar100", 2): (1.0, 100), ("cifar100", 5): (1.35, 100), ("cifar100", 10): (1.15, 100),
         ("cifar100", 20): (1.0, 100), ("tiny-imagenet", 2): (1.0, 200), ("tiny-imagenet", 5): (1.35, 200),
         ("tiny-imagenet", 10): (1.2, 200), ("tiny-imagenet", 20): (1.113, 200)}


def cli_given(**options) -> dict:
    """What `sb train` hands to build_options: every option at its default, then ``options``."""
    params = inspect.signature(train_cmd.train).parameters
    given = {name: p.default for name, p in params.items() if name != "json_out"}
    return {**given, **options}


@pytest.mark.parametrize(("source", "tasks"), list(PAPER))
def test_paper_recipes_build_the_papers_options(source, tasks, tmp_path):
    rho, classes = PAPER[source, tasks]
    data_root = str(tmp_path) if source == "tiny-imagenet" else None
    given = cli_given(source=source, recipe=f"paper-{tasks}", data_root=data_root, out=tmp_path / "run")
    seq, run, out = options.build_options(given, defaults_for(source))
    assert (seq.source, seq.tasks, seq.order_seed, seq.base) == (source, tasks, 0, None)
    assert run.method == "sb" and run.arch == "resnet18" and run.width == 1.0 and run.memory == 2000
    assert (run.train.epochs, run.train.batch_size, run.train.lr) == (200, 256, 0.1)
    given_to_method = {k: v for k, v in run.method_options.items() if v is not None}
    assert given_to_method == {"rho": rho, "sparsity": "code", "gamma": 1.0, "epochs_a": 200, "epochs_b": 200,
                               "epochs_c": 200}
    cfg = build_config(run.method, run.method_options)
    assert cfg.rho == rho and cfg.sparsity == "code" and not cfg.bn_reset
    assert classes % tasks == 0 and out == tmp_path / "run"


def test_recipe_by_file_without_a_source_and_command_line_overrides(tmp_path):
    path = ZOO_RECIPES / "cifar100-paper-10.toml"
    given = cli_given(recipe=str(path), epochs=3, rho=1.3, phase_epochs="1,2,3")
    seq, run, _ = options.build_options(given, defaults_for(None))
    assert seq.source == "cifar100" and seq.tasks == 10 and run.memory == 2000 and run.width == 1.0
    assert run.train.epochs == 3 and run.method_options["rho"] == 1.3
    assert (run.method_options["epochs_a"], run.method_options["epochs_c"]) == (1, 3)


def test_recipes_are_listed_and_refuse_unknown_keys_and_other_sources(tmp_path):
    names = list_recipes()
    for source, tasks in PAPER:
        assert f"{source}-paper-{tasks}" in names
        assert load_recipe(f"paper-{tasks}", source)["source"] == source
    bad = tmp_path / "bad.toml"
    bad.write_text('source = "cifar100"\nmethod = "sb"\nrhoo = 1.2\n')
    with pytest.raises(ConfigError, match="rhoo"):
        options.build_options(cli_given(recipe=str(bad)), defaults_for(None))
    with pytest.raises(ConfigError, match="is for cifar100, not cifar10"):
        recipe = str(ZOO_RECIPES / "cifar100-paper-10.toml")
        options.build_options(cli_given(source="cifar10", recipe=recipe), defaults_for("cifar10"))


# --------------------------------------------------------------------------------------------
# End to end on real images: sb train --method sb, then sb add-task, then sb evaluate
# --------------------------------------------------------------------------------------------

# About 60 s on a busy 2-core machine: 16 px images, a quarter-width ResNet-18, 200 images per class,
# a memory large enough that the old classes are not swamped in so few epochs.
RUN = ["--width", "0.25", "--image-size", "16", "--epochs", "8", "--phase-epochs", "4,4,4", "--batch-size", "32",
       "--memory", "300", "--device", "cpu"]


def test_sb_train_then_add_task_on_real_images(cifar10_subset, tmp_path):
    runner = CliRunner()
    torch.manual_seed(0)  # api.train builds the first network before it seeds torch: fix it here
    first_train, first_test = cifar10_subset(["airplane", "deer", "horse", "truck"], 200, 100)
    more_train, more_test = cifar10_subset(["frog", "ship"], 200, 100)
    learner = tmp_path / "learner"
    res = runner.invoke(app, ["train", str(first_train), "--test", str(first_test), "--method", "sb", "--tasks", "2",
                              "--order-seed", "-1", "--out", str(learner), *RUN])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["add-task", str(learner), str(more_train), "--test", str(more_test), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["evaluate", str(learner), "--json", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout)
    history = result["history"]
    assert [h["num_classes"] for h in history] == [2, 4, 6]
    for h in history:  # well above chance (50 %, 25 %, 16.7 %) after every step; measured: 79, 44, 33
        chance = 100.0 / h["num_classes"]
        assert h["metrics"]["overall"] > chance + 10, h["metrics"]
    for h, bf in ((history[1], 0.5), (history[2], 4 / 6)):  # rho 1: bf = C_old / C_total, from the learner's classes
        record = h["record"]
        assert record["partition"]["bf"] == pytest.approx(bf) and record["partition"]["old"]["classes"] == h["num_classes"] - 2
        assert [p["name"] for p in h["phases"]] == ["A", "B", "C"]  # a folder: no balancing by default
        assert [p["epochs"] for p in h["phases"]] == [4, 4, 4]
        assert {"after_B", "after_C", "cross_norm_before_disconnect", "wa_factor"} <= set(record)
    res = runner.invoke(app, ["evaluate", str(learner), "--device", "cpu"])
    assert res.exit_code == 0 and "Split-and-Bridge ablation" in res.stdout and "split (after B)" in res.stdout
