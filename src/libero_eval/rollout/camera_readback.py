"""Render an env's cameras one after another and read them back from the GPU once.

robosuite renders each camera and reads it back before the next (`MjSim.render`: `mjr_render`,
then `mjr_readPixels`). Each read-back waits for the GPU to finish; on a GPU that a policy
server keeps busy, each such wait also waits for the GL context's turn on the GPU. Here each
camera is rendered exactly as robosuite renders it, at the offscreen buffer's origin, and
resolved there as `mjr_readPixels` resolves it; the resolved image is then copied beside the
others in the resolve buffer, and one `glReadPixels` reads them all.

The authorities, read for this (MuJoCo 3.17.0, robosuite 1.4.0):
- MuJoCo's `render_gl2.c`, `mjr_readPixels`: with a multisampled offscreen buffer it blits
  `offFBO` to `offFBO_r` over the viewport (`GL_NEAREST`), reads `offFBO_r`, then
  `mjr_restoreBuffer`. A same-size `GL_NEAREST` blit copies pixels exactly.
- robosuite's `MjRenderContext.render` (`mjv_updateScene` for the camera, `mjr_render` at
  viewport (0, 0, width, height)) and `MjSim.render` (holds `_MjSim_render_lock`).

`libero_eval.rollout.render_on_demand` checks each env's first read-back against robosuite's
own, byte for byte, and uses this only where they are equal.
"""

from __future__ import annotations

import os

import numpy as np


def can_render_together(sim, count: int, width: int, height: int) -> bool:
    """Whether `count` images of width x height fit side by side in the sim's multisampled
    offscreen buffer, rendered through EGL (else robosuite's own render, one camera at a
    time)."""
    context = getattr(sim, "_render_context_offscreen", None)
    if context is None or os.environ.get("MUJOCO_GL") != "egl":
        return False
    con = context.con
    return bool(con.offSamples) and count * width <= con.offWidth and height <= con.offHeight


def render_together(sim, cameras: tuple[str, ...], width: int, height: int) -> dict:
    """Each camera's image as `sim.render(camera_name=..., width, height)` gives it (rows
    bottom-up, as `mjr_readPixels` writes them), with one read-back for all of them."""
    import mujoco
    from OpenGL import GL
    from robosuite.utils.binding_utils import _MjSim_render_lock

    context = sim._render_context_offscreen
    con = context.con
    with _MjSim_render_lock:
        # The last camera first: the first one ends where mjr_readPixels would read it.
        for slot in reversed(range(len(cameras))):
            context.render(width, height, camera_id=sim.model.camera_name2id(cameras[slot]))
            GL.glBindFramebuffer(GL.GL_READ_FRAMEBUFFER, con.offFBO)
            GL.glReadBuffer(GL.GL_COLOR_ATTACHMENT0)
            GL.glBindFramebuffer(GL.GL_DRAW_FRAMEBUFFER, con.offFBO_r)
            GL.glDrawBuffer(GL.GL_COLOR_ATTACHMENT0)
            GL.glBlitFramebuffer(
                0, 0, width, height, 0, 0, width, height, GL.GL_COLOR_BUFFER_BIT, GL.GL_NEAREST
            )
            if slot:
                left = slot * width
                GL.glBindFramebuffer(GL.GL_READ_FRAMEBUFFER, con.offFBO_r)
                GL.glBlitFramebuffer(
                    0,
                    0,
                    width,
                    height,
                    left,
                    0,
                    left + width,
                    height,
                    GL.GL_COLOR_BUFFER_BIT,
                    GL.GL_NEAREST,
                )
            mujoco.mjr_restoreBuffer(con)
        pixels = np.empty((height, len(cameras) * width, 3), dtype=np.uint8)
        GL.glBindFramebuffer(GL.GL_READ_FRAMEBUFFER, con.offFBO_r)
        GL.glReadBuffer(GL.GL_COLOR_ATTACHMENT0)
        GL.glReadPixels(
            0, 0, len(cameras) * width, height, con.readPixelFormat, GL.GL_UNSIGNED_BYTE, pixels
        )
        mujoco.mjr_restoreBuffer(con)
    return {
        camera: np.ascontiguousarray(pixels[:, slot * width : (slot + 1) * width])
        for slot, camera in enumerate(cameras)
    }
