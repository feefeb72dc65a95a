"""The arm and gripper as the scripted expert models them: gripper commands, the OSC_POSE
controller's per-step response and the action bounds, the gripper's width, the finger and
hand geometry around the end-effector site, and the down-pointing home orientation."""

from __future__ import annotations

import numpy as np

GRIPPER_OPEN = -1.0
GRIPPER_CLOSE = 1.0

# OSC_POSE response (robosuite defaults, 20 Hz): steady-state end-effector travel per step per
# unit of action, measured in LIBERO.
METRES_PER_STEP_PER_ACTION = 0.0135
RADIANS_PER_STEP_PER_ACTION = 0.12
# Action bounds inside the stats' q01..q99 (translation) and rot6d q01..q99 (rotation).
TRANSLATION_ACTION_LOW = np.array([-0.70, -0.78, -0.90])
TRANSLATION_ACTION_HIGH = np.array([0.90, 0.84, 0.90])
ROTATION_ACTION_LIMIT = np.array([0.09, 0.14, 0.20])

GRIPPER_WIDTH_OPEN = 0.078  # metres between the finger joints, fully open
GRIPPER_WIDTH_PER_STEP = 0.009
GRIPPER_READY_WIDTH = 0.066  # open enough to descend around an object

# Finger geometry relative to the end-effector site (robot0_eef_pos, between the pads).
FINGERTIP_BELOW_EEF = 0.0145
HAND_BOTTOM_ABOVE_EEF = 0.024  # the hand's box: above the fingers, long along the closing axis
HAND_HALF_LENGTH = 0.105
HAND_HALF_THICKNESS = 0.035
MAX_GRASP_WIDTH = 0.072

# Down-pointing gripper with yaw 0 (the LIBERO home orientation).
R_DOWN = np.diag([1.0, -1.0, -1.0])
