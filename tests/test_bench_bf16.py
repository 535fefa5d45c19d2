"""The bench's CPU header, its bf16 rows (the mixed_bfloat16 step against the bf16 ceiling, the fused bf16
cell's lever) and the PyTorch reference in bf16 (benchmarks/torch_reference.py), from hand-made
measurements and a stand-in torch module."""
import os
import subprocess
import sys
import textwrap

import pytest

from benchmarks import orchestration, report
from conftest import ROOT


def _row(ms, words, flops=6.4e9, **extra):
    return {"ms_per_step": (ms, ms, ms), "windows_ms": [ms], "words_per_s": (words, words, words), "ranks": 1,
            "cpu_ms_per_step": [60.0], "flops_per_step": flops, "peak_rss_mb": [500], "tokens_per_step": 400,
            **extra}


def test_the_header_names_the_cpu_its_family_and_model_and_its_matmul_flags(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
                       "model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu avx2 fma avx512f avx512_bf16 "
                       "amx_tile amx_bf16 hypervisor\n\nprocessor\t: 1\n")
    assert orchestration.cpu_description(str(cpuinfo)) == (
        "Intel(R) Xeon(R) Platinum 8480+ (family 6, model 143, avx2, fma, avx512f, avx512_bf16, amx_tile, amx_bf16, "
        "hypervisor)")
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2\n")
    assert orchestration.cpu_description(str(cpuinfo)) == "unknown CPU (no AVX2)"
    assert orchestration.cpu_description(str(tmp_path / "missing")) == "unknown CPU"


def _results():
    matmul = {"float32": (245.0, 240.0, 250.0), "float32_per_cpu_s": 125.0, "bfloat16": (585.0, 580.0, 590.0),
              "bfloat16_by_size": {"1024": (400.0, 390.0, 410.0), "2048": (585.0, 580.0, 590.0),
                                   "3072": (560.0, 550.0, 570.0)}}
    rounds = [{"small": _row(50.0, 8000), "small_bf16": _row(32.0, 12500, cell="fused kernel"),
               "small_bf16_tf_ops_cell": _row(40.0, 10000, cell="TF ops"),
               "torch": {"words_per_s": 6000.0, "torch": "2.x", "steps": 300},
               "torch_bf16": {"words_per_s": 4000.0, "torch": "2.x", "steps": 300}}]
    results = {"matmul": matmul, "rounds": rounds}
    for name in ("small", "small_bf16", "small_bf16_tf_ops_cell"):
        results[name] = orchestration.merge_rounds([r[name] for r in rounds])
    for name in ("torch", "torch_bf16"):
        results[name] = orchestration.merge_torch_rounds([r[name] for r in rounds])
    return results


def test_the_bf16_step_is_reported_against_the_bf16_ceiling():
    results = _results()
    assert report.bf16_ceiling(results) == 590.0
    assert report.bf16_text(results["matmul"]).startswith(
        "590 GFLOP/s (the fastest repeat; median (min-max) of 1024^3: 400 (390-410), ")
    rows = {row[0]: row for row in report.table_rows(results)}
    # 6.4 GFLOP in 32 ms = 200 GFLOP/s: 80% of the fp32 ceiling (250), 34% of the bf16 one (590).
    assert rows["small, mixed_bfloat16"][4:6] == ("200", "80% (34% of bf16)")
    assert rows["small, 1 process, 2 threads"][5] == "51%"
    assert report.bf16_line(results) == (
        "The mixed_bfloat16 small step (fused kernel LSTM cell) runs its matmul FLOPs at 200 GFLOP/s: 33.9% of the "
        "bf16 ceiling (590 GFLOP/s) and 80.0% of the fp32 ceiling.")
    levers = {lever: (base, wall) for lever, base, wall, _ in report.lever_rows(results)}
    assert levers["small, mixed_bfloat16, the LSTM as TF ops (no fused bf16 LSTM kernel)"] == (
        "small, mixed_bfloat16", "1.25x")
    # A run without a bf16 ceiling (an older --json) reports as before.
    del results["matmul"]["bfloat16"], results["matmul"]["bfloat16_by_size"]
    assert report.bf16_line(results) == ""
    assert {row[0]: row for row in report.table_rows(results)}["small, mixed_bfloat16"][5] == "80%"


def test_the_pytorch_reference_is_reported_in_fp32_and_bf16():
    line = report.torch_line(_results())
    assert "300 steps a run, timed in the same run as ours): **6000 words/s**; in bf16 (" in line
    assert ("`benchmarks/torch_reference.py --bf16`: torch.autocast(\"cpu\", dtype=torch.bfloat16) around the "
            "forward pass and loss): **4000 words/s**; ours (small, 1 process): **8000 words/s**, in "
            "mixed_bfloat16 **12500 words/s**.") in line


@pytest.fixture
def reference_venv(tmp_path, monkeypatch):
    """A stand-in PyTorch venv's python and reference script, where the bench looks for them."""
    python, reference = tmp_path / "python", tmp_path / "torch_ref_lm.py"
    python.write_text("")
    reference.write_text("")
    monkeypatch.setattr(orchestration, "TORCH_PYTHON", str(python))
    monkeypatch.setattr(orchestration, "TORCH_REFERENCE", str(reference))
    return python, reference


def test_the_reference_runs_through_the_wrapper_with_bf16_by_a_flag(reference_venv, monkeypatch):
    python, reference = reference_venv
    commands = []

    def run(command, **kwargs):
        commands.append(command)
        return subprocess.CompletedProcess(command, 0, "epoch 0 lr 1.0000 train 700.00 wps 5432\n" if
                                           len(commands) % 2 else "2.x\n", "")

    monkeypatch.setattr(orchestration.subprocess, "run", run)
    assert orchestration.torch_reference("/data", 300, bf16=True) == {
        "words_per_s": 5432.0, "torch": "2.x", "steps": 300, "precision": "bf16 autocast"}
    assert commands[0] == [str(python), orchestration.TORCH_WRAPPER, "--bf16", str(reference), "/data", "1", "300"]
    assert orchestration.torch_reference("/data", 300)["precision"] == "fp32"
    assert commands[2] == [str(python), orchestration.TORCH_WRAPPER, str(reference), "/data", "1", "300"]


ONEDNN_ERROR = ("Traceback (most recent call last):\n  File \"torch_ref_lm.py\", line 70, in run\nRuntimeError: could "
                "not create a primitive descriptor for the LSTM forward propagation primitive. Run workload with "
                "environment variable ONEDNN_VERBOSE=all to get additional diagnostic information.\n\n")
ONEDNN_REASON = "RuntimeError: could not create a primitive descriptor for the LSTM forward propagation primitive"


def _reference_runs(monkeypatch, onednn_off_stdout, onednn_off_stderr=""):
    """subprocess.run for the reference: with oneDNN its bf16 run stops as on an AVX2 CPU (oneDNN has no
    bf16 LSTM primitive for it); with --onednn_off it prints the given output. Returns the commands."""
    commands = []

    def run(command, **kwargs):
        commands.append(command)
        if "-c" in command:
            return subprocess.CompletedProcess(command, 0, "2.x\n", "")
        if "--onednn_off" in command:
            return subprocess.CompletedProcess(command, 0 if onednn_off_stdout else 1, onednn_off_stdout,
                                               onednn_off_stderr)
        return subprocess.CompletedProcess(command, 1, "", ONEDNN_ERROR)

    monkeypatch.setattr(orchestration.subprocess, "run", run)
    return commands


def test_a_reference_that_fails_on_this_cpu_both_ways_is_reported_and_the_bench_goes_on(reference_venv,
                                                                                         monkeypatch):
    commands = _reference_runs(monkeypatch, "", "Killed\n")
    failed = orchestration.torch_reference("/data", 300, bf16=True)
    reason = f"{ONEDNN_REASON}; with oneDNN off, Killed"
    assert failed == {"failed": reason, "torch": "2.x", "steps": orchestration.ONEDNN_OFF_STEPS,
                      "precision": "bf16 autocast, oneDNN off", "onednn_failed": ONEDNN_REASON}
    assert [c for c in commands if "--onednn_off" in c] == [
        [*commands[0][:3], "--onednn_off", *commands[0][3:6], str(orchestration.ONEDNN_OFF_STEPS)]]
    results = _results()
    for paired in results["rounds"]:
        paired["torch_bf16"] = failed
    results["torch_bf16"] = orchestration.merge_torch_rounds([failed, {"words_per_s": 4000.0}])
    assert results["torch_bf16"] == failed
    line = report.torch_line(results)
    assert f"around the forward pass and loss): failed on this machine ({reason}); ours (small" in line
    goals = {text: (value, met) for text, value, met in report.goals(results)}
    assert goals["mixed_bfloat16 words/s >= 1.3x PyTorch's, both bf16"] == (
        f"not measured: the reference failed here ({reason})", False)
    assert goals["words/s >= 1.5x PyTorch"] == ("1.33x", False)


def test_where_its_onednn_lstm_fails_in_bf16_the_reference_runs_on_pytorchs_own_kernels(reference_venv,
                                                                                       monkeypatch):
    commands = _reference_runs(monkeypatch, "epoch 0 lr 1.0000 train 1300.00 wps 250\n")
    reference = orchestration.torch_reference("/data", 300, bf16=True)
    assert reference == {"words_per_s": 250.0, "torch": "2.x", "steps": orchestration.ONEDNN_OFF_STEPS,
                         "precision": "bf16 autocast, oneDNN off", "onednn_failed": ONEDNN_REASON}
    assert commands[1][1:4] == [orchestration.TORCH_WRAPPER, "--bf16", "--onednn_off"]
    # Without --bf16 nothing runs a second time, whatever the outcome.
    commands.clear()
    assert "failed" in orchestration.torch_reference("/data", 300)
    assert len(commands) == 2 and "--onednn_off" not in commands[0]
    results = _results()
    for paired in results["rounds"]:
        paired["torch_bf16"] = reference
    results["torch_bf16"] = orchestration.merge_torch_rounds([r["torch_bf16"] for r in results["rounds"]])
    line = report.torch_line(results)
    assert (f"around the forward pass and loss): its run with oneDNN failed on this machine ({ONEDNN_REASON}), so with "
            f"oneDNN off (`--onednn_off`: PyTorch's own kernels, {orchestration.ONEDNN_OFF_STEPS} steps a run) "
            "**250 words/s**; ours (small") in line
    goals = {text: (value, met) for text, value, met in report.goals(results)}
    # 12500 words/s in mixed_bfloat16 against 250.
    assert goals["mixed_bfloat16 words/s >= 1.3x PyTorch's, both bf16 (PyTorch's run with oneDNN off, its oneDNN "
                 "run having failed here)"] == ("50.00x", True)


def test_the_wrapper_opens_autocast_exactly_where_the_reference_computes_forward_and_loss(tmp_path):
    # A stand-in torch module records what the reference sees: autocast is on inside its
    # set_grad_enabled block only, and only with --bf16; oneDNN is off with --onednn_off only; the
    # reference gets its own arguments.
    (tmp_path / "torch.py").write_text(textwrap.dedent("""\
        import contextlib
        import types
        bfloat16 = "bfloat16"
        state = {"autocast": None, "grad": True}
        backends = types.SimpleNamespace(mkldnn=types.SimpleNamespace(enabled=True))

        class set_grad_enabled:  # as torch's: the mode changes when called, and returns at the block's end
            def __init__(self, mode):
                self.prev, state["grad"] = state["grad"], mode

            def __enter__(self):
                pass

            def __exit__(self, *exc):
                state["grad"] = self.prev

        @contextlib.contextmanager
        def autocast(device, dtype):
            state["autocast"] = (device, dtype)
            yield
            state["autocast"] = None
        """))
    reference = tmp_path / "reference.py"
    reference.write_text(textwrap.dedent("""\
        import sys
        import torch
        seen = [torch.backends.mkldnn.enabled, torch.state["autocast"]]
        with torch.set_grad_enabled(False):
            seen.append((torch.state["autocast"], torch.state["grad"]))
        torch.set_grad_enabled(False)  # as torch.no_grad calls it
        seen.append((torch.state["autocast"], torch.state["grad"]))
        print(sys.argv[1:], *seen)
        """))
    wrapper = os.path.join(ROOT, "benchmarks", "torch_reference.py")
    for flags, onednn, inside in (([], True, "None"), (["--bf16"], True, "('cpu', 'bfloat16')"),
                                  (["--bf16", "--onednn_off"], False, "('cpu', 'bfloat16')"),
                                  (["--onednn_off"], False, "None")):
        proc = subprocess.run([sys.executable, wrapper, *flags, str(reference), "/data", "1", "300"],
                              env=dict(os.environ, PYTHONPATH=str(tmp_path)), capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == f"['/data', '1', '300'] {onednn} None ({inside}, False) (None, False)\n"
