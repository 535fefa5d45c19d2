"""scripts/step_profile.py --perf: perf's samples summed by the code that ran."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def step_profile():
    spec = importlib.util.spec_from_file_location("step_profile", os.path.join(ROOT, "scripts", "step_profile.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Samples as `perf script -F ip,sym,dso` prints them, "address symbol (library)", with
# symbols and paths shortened where they run long.
TF = "(/v/tensorflow/libtensorflow_cc.so.2)"
LSTM = "(/w/texar_lite/kernels/lstm_cell.so)"
SAMPLES = [
    "7f6a3c5468a7 [unknown] (/tmp/perf-19547.map)",
    "7f6a3c546acc [unknown] (/tmp/perf-19547.map)",
    f"101ad360 Eigen::internal::gemm_pack_colmajor_block<float, long, Sub<float, 0> >::operator() {TF}",
    f"7991 (anonymous namespace)::DotTile<4, 3>::Run {LSTM}",
    f"7a10 (anonymous namespace)::MultiplyPanels {LSTM}",
    "8b02 std::_Function_handler<void (long, long), (anonymous namespace)::ForBlocks<(anonymous "
    f"namespace)::Fp32Products::Backward(float*) const::{{lambda(long, long)#1}}> >::_M_invoke {LSTM}",
    f"9c20 (anonymous namespace)::LstmSequenceForwardOp<float>::Compute {LSTM}",
    "76b1 tensorflow::(anonymous namespace)::SoftmaxCrossEntropyRow (/w/texar_lite/kernels/softmax_xent.so)",
    "4a81 (anonymous namespace)::Product::Columns (/w/texar_lite/kernels/affine.so)",
    "3e07 (anonymous namespace)::Tile<true> (/w/texar_lite/kernels/affine.so)",
    "2b56d0d Eigen::ThreadPoolTempl<tsl::thread::EigenEnvironment>::GlobalSteal (/v/libtensorflow_framework.so.2)",
    "ffffffff822332cb pv_native_safe_halt ([kernel.kallsyms])",
    "152c29 __memmove_avx_unaligned_erms (/usr/lib/x86_64-linux-gnu/libc.so.6)",
    "1a2b3c _PyEval_EvalFrameDefault (/root/.pyenv/versions/3.11.9/lib/libpython3.11.so.1.0)",
    f"3c4d5e tensorflow::ConcatCPU<float> {TF}",
    "1234 [unknown] (/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30)",
]
SCRIPT = "\n" + "".join(f"\t    {sample}\n" for sample in SAMPLES)


def test_perf_samples_are_summed_by_the_code_that_ran(step_profile):
    assert step_profile.samples_by_part(SCRIPT) == {
        "the matmuls' inner kernels (JIT code)": 2,
        "Eigen packing the matmuls' operands": 1,
        "the LSTM ops' products": 3,
        "the LSTM ops' gate math": 1,
        "the fused loss": 1,
        "the affine ops' products": 2,
        "TensorFlow's thread pool looking for work": 1,
        "the Linux kernel": 1,
        "the C library (copies, allocation)": 1,
        "Python": 1,
        "the rest of TensorFlow": 1,
        "the rest": 1,
    }


def test_perf_must_be_there_before_any_step_runs(step_profile, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SystemExit, match="--perf needs Linux perf on the PATH: install it"):
        step_profile.main(["--perf"])
