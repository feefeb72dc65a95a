"""tools/gpu/spy_summary.py: a server main thread's samples split into GPU waits and Python, by
stage, from a py-spy raw profile written here in its format."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("spy_summary", REPO / "tools/gpu/spy_summary.py")
spy_summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(spy_summary)

MAIN = "<module> (<string>:1);Scheduler.event_loop (scheduler.py:1581)"
STAGE = "PipelineExecutor.run_stage_with_context (pipeline_executor.py:236)"
WAIT = ";".join(
    (
        "GPUWorker._forward_group (gpu_worker.py:1330)",
        "VLAActionDenoisingStage.run_grouped_requests (vla.py:9)",
        "synchronize_vla_action_tensor (vla.py:3)",
        "synchronize (torch/cuda/__init__.py:1162)",
    )
)
PROFILE = f"""\
{MAIN};{WAIT} 6
{MAIN};{STAGE};PipelineStage.__call__ (stage.py:5);_preprocess_image (pi05_preprocess.py:114) 3
{MAIN};Scheduler.recv_reqs (scheduler.py:1403) 1
Thread 42 (idle);wait (threading.py:1) 50
"""


def test_the_main_threads_samples_split_into_gpu_waits_and_python_by_stage(tmp_path):
    profile = tmp_path / "pyspy_server.txt"
    profile.write_text(PROFILE)
    lines = spy_summary.summarize(profile).splitlines()
    assert lines[0] == "pyspy_server.txt: 10 samples of the main thread"  # not thread 42's
    assert "60.0%  GPU wait  GPUWorker._forward_group" in lines[1]
    assert "30.0%  Python    PipelineStage.__call__" in lines[2]
    assert "10.0%  Python    Scheduler.recv_reqs" in lines[3]
    assert lines[-1].endswith(
        "60.0%  synchronize_vla_action_tensor <- VLAActionDenoisingStage.run_grouped_requests"
    )
