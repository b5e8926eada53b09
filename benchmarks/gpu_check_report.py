"""``results.md`` of benchmarks/gpu_check.py, from its ``results.json`` data."""

from __future__ import annotations

TARGET_IMG_S = 60_000.0  # with a teacher (an incremental step), on one H100/H200
TARGET_NO_TEACHER_IMG_S = 80_000.0  # without (a first step)
TARGET_X_REF = 10.0


def markdown(r: dict) -> str:
    """The whole check as Markdown: environment, tests, benchmark(s), profile, the sequence's tables."""
    lines = ["# sbcli GPU check", ""]
    env = r.get("env", {})
    if env:
        gpus = ", ".join(g["name"] for g in env.get("gpus", [])) or "no GPU"
        lines += [f"{gpus} · torch {env.get('torch')} (CUDA {env.get('cuda')}, cuDNN {env.get('cudnn', '–')}, "
                  f"NCCL {env.get('nccl', '–')}) · Python {env.get('python')} · {env.get('cpus')} CPUs · "
                  f"missing packages: {', '.join(env.get('missing', [])) or 'none'} · WebP {env.get('webp')} · "
                  f"sb --help {env.get('sbcli_help')}", ""]
    t = r.get("tests")
    if t:
        c = t.get("counts", {})
        lines += ["## pytest -m gpu", "", f"exit {t['exit_code']} · {c.get('passed', '?')} passed, {c.get('failures', 0)} "
                  f"failed, {c.get('errors', 0)} errors, {c.get('skipped', '?')} skipped · {t['seconds']} s", ""]
        lines += [f"- FAILED {f['test']}: {f['message']}" for f in t.get("failed", [])]
        lines += [f"- skipped ({n}): {reason}" for reason, n in t.get("skip_reasons", {}).items()]
        lines.append("")
    for key, title in (("bench", "Engine throughput, batch 256"), ("bench512", "Engine throughput, batch 512"),
                       ("compile", "Engine throughput with --compile")):
        lines += bench_markdown(r.get(key), title)
    p = r.get("profile")
    if p and p.get("top"):
        busy = "" if p["gpu_busy_fraction"] is None else f", GPU busy {100 * p['gpu_busy_fraction']:.0f} % of the wall time"
        lines += ["## Profile: one epoch of phase C", "", f"{p['batches']} batches of {p['batch_size']}, "
                  f"{p['images_per_s']:,.0f} img/s under the profiler{busy}; sorted by {p['sort']}.", "",
                  "| op | total ms | self ms | calls |", "|---|---:|---:|---:|"]
        lines += [f"| {e['op']} | {e['total_ms']} | {e['self_ms']} | {e['calls']} |" for e in p["top"]]
        lines.append("")
    lines += ddp_markdown(r.get("ddp"))
    s = r.get("sequence")
    if s and "rows" in s:
        from compare_report import report_markdown

        lines += [report_markdown(s).replace("# ", "## ", 1)]  # its title one level down
    elif s:
        lines += ["## Sequence", "", str(s.get("skipped") or s.get("error")), ""]
    for step, error in r.get("errors", {}).items():
        lines += [f"**{step} failed**: {error}", ""]
    lines.append(f"Total {r.get('elapsed_s', '?')} s.")
    return "\n".join(lines) + "\n"


def bench_markdown(b: dict | None, title: str) -> list[str]:
    if not b:
        return []
    if not b.get("rows"):
        return [f"## {title}", "", f"FAILED (exit {b['exit_code']}):", "", "```", b.get("tail", ""), "```", ""]
    lines = [f"## {title} (benchmarks/engine_speed.py)", "", f"{b['hardware']} · torch {b['torch']} · `{b['command']}`",
             "", "| loop | img/s | x reference | TFLOP/s |", "|---|---:|---:|---:|"]
    lines += [f"| {row['name']} | {row['img_s']:,.0f} | {row['x_reference']:.1f}x | {row.get('tflop_s', float('nan')):,.1f} |"
              for row in b["rows"]]
    verdict = "meets" if b["meets_target"] else "MISSES"
    hours = ", ".join(f"{k}: {v:.1f} h" for k, v in b["paper_cifar100_10_tasks_hours"].items())
    flops = b.get("flops_per_image")
    if flops:
        lines += ["", f"FLOPs per image: {flops['with_teacher_gflop']:.2f} GFLOP with a teacher, "
                  f"{flops['no_teacher_gflop']:.2f} without (torch's FLOP counter); the bf16 matrix rate the device "
                  "docs measured is about 790 TFLOP/s."]
    without = b.get("without_teacher_img_s")
    without_text = "" if without is None else f", without: {without:,.0f} img/s"
    return lines + ["", f"With a teacher: {b['with_teacher_img_s']:,.0f} img/s{without_text}; {verdict} the targets (>= "
                    f"{TARGET_IMG_S:,.0f} img/s with a teacher, >= {TARGET_NO_TEACHER_IMG_S:,.0f} without, >= "
                    f"{TARGET_X_REF:.0f}x the reference). Paper CIFAR-100 10-task schedule at these rates: {hours}.", ""]


def ddp_markdown(d: dict | None) -> list[str]:
    if not d:
        return []
    if "skipped" in d or "error" in d:
        return ["## DDP", "", str(d.get("skipped") or d.get("error")), ""]
    verdict = "passed" if d["passed"] else "FAILED"
    lines = ["## DDP (torchrun, then one process)", "",
             f"{verdict}: torchrun --nproc-per-node {d['nproc']} on {d['device']} exit {d['torchrun_exit']} "
             f"({d['torchrun_s']} s), rank 0 alone printed: {d['rank0_alone_printed']}, processes in step 2's phases: "
             f"{d.get('processes_step2')}; sb add-task in one process exit {d.get('add_task_exit')}, steps after it: "
             f"{d.get('steps_after_add_task')}.", ""]
    return lines + (["```", d["tail"], "```", ""] if d.get("tail") else [])
