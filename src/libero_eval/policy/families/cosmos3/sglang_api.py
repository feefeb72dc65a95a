"""The facts of SGLang 0.5.23's Cosmos3 action API that the reference server's Cosmos3 forms
(``reference_requests``, ``reference_responses``) serve by: domain names and ids, default raw
action dims, sampling defaults, response formats."""

from __future__ import annotations

ACTION_HORIZON = 16
LIBERO_DOMAIN_NAME = "libero"
# SGLang 0.5.23 pipelines_core/stages/model_specific_stages/cosmos3_action.py.
EMBODIMENT_TO_DOMAIN_ID: dict[str, int] = {
    "no_action": 0,
    "av": 1,
    "camera_pose": 2,
    "hand_pose": 3,
    "pusht": 4,
    "libero": 5,
    "umi": 6,
    "bridge_orig_lerobot": 7,
    "droid_lerobot": 8,
    "robomind-franka": 8,
    "galbot": 9,
    "robomind-franka-dual": 12,
    "robomind-ur": 13,
    "agibotworld": 15,
    "agibot_gear_gripper": 15,
    "agibot_gear_gripper_ext": 15,
    "fractal": 20,
}
EMBODIMENT_TO_RAW_ACTION_DIM: dict[str, int] = {
    "av": 9,
    "camera_pose": 9,
    "pusht": 2,
    "umi": 10,
    "bridge_orig_lerobot": 10,
    "droid_lerobot": 10,
    "robomind-franka": 10,
    "robomind-franka-dual": 20,
    "robomind-ur": 10,
    "agibotworld": 29,
    "fractal": 10,
}
LIBERO_DOMAIN_ID = EMBODIMENT_TO_DOMAIN_ID[LIBERO_DOMAIN_NAME]
# SGLang 0.5.23 configs/sample/cosmos3.py, Cosmos3SamplingParams defaults.
SUPPORTED_RESOLUTIONS = [[1280, 720], [720, 1280], [832, 480], [480, 832], [1024, 1024], [640, 640]]
DEFAULT_NUM_INFERENCE_STEPS = 35
DEFAULT_SEED = 42
RESPONSE_FORMATS = ("envelope", "raw")
