"""The end-of-step stages' typed reports write exactly the keys a learner has always kept, in the order they ran."""

import json

from sbcli.methods.rules.stages import AlignReport, BalanceReport, record_json
from sbcli.metrics import StepMetrics


def metrics(overall: float) -> StepMetrics:
    return StepMetrics(overall=overall, per_task=[overall], old=overall, new=overall, intra_old=overall,
                       intra_new=overall)


def test_stage_reports_write_the_keys_learner_json_always_had_in_the_order_they_ran():
    before_balance, before_wa = metrics(40.0), metrics(50.0)
    record = record_json({"partition": {"bf": 1.0}}, [BalanceReport(before_balance), AlignReport(0.9, before_wa)])
    assert list(record) == ["partition", "before_balance", "before_wa", "wa_factor"]
    assert record["before_balance"] == before_balance.to_json() and record["wa_factor"] == 0.9
    aligned_first = record_json({}, [AlignReport(0.8, before_wa), BalanceReport(before_balance)])
    assert list(aligned_first) == ["before_wa", "wa_factor", "before_balance"]
    assert json.dumps(record_json({"after_C": {"overall": 1.0}}, [AlignReport(1.25)])) == \
        '{"after_C": {"overall": 1.0}, "wa_factor": 1.25}'  # no accuracy before: none written


def test_a_rule_declares_the_stages_a_step_ends_with_in_order():
    from sbcli.methods.rules import RULES

    assert RULES.get("wa").stages == ("align", "balance")
    assert RULES.get("icarl").stages == ("refresh", "balance")
    assert RULES.get("bic").stages == ()  # its bias layer corrects what balancing would; nothing kept from the memory
    assert all(list(RULES.get(n).stages) == sorted(RULES.get(n).stages, key=("refresh", "align", "balance").index)
               for n in RULES.names())
