"""Reading back the MP4s --mode=test records."""

import cv2
import numpy as np


def read_video(path: str) -> tuple[np.ndarray, dict[str, float]]:
    """All frames of an MP4 ([T, height, width, 3] BGR) and what its header says."""
    capture = cv2.VideoCapture(path)
    assert capture.isOpened(), path
    header = {
        "frames": capture.get(cv2.CAP_PROP_FRAME_COUNT),
        "fps": capture.get(cv2.CAP_PROP_FPS),
        "size": (capture.get(cv2.CAP_PROP_FRAME_WIDTH), capture.get(cv2.CAP_PROP_FRAME_HEIGHT)),
    }
    frames = []
    while (frame := capture.read()[1]) is not None:
        frames.append(frame)
    capture.release()
    return np.array(frames), header


def check_video(path: str, steps: int, fps: float, size: tuple[int, int]) -> np.ndarray:
    """The game's MP4: its first screen, then one per agent step, at the game's real speed."""
    frames, header = read_video(path)
    assert header == {"frames": steps + 1, "fps": fps, "size": size}
    assert len(frames) == steps + 1
    assert frames.std() > 20  # Something drawn, not a blank screen.
    assert np.abs(np.diff(frames.astype(np.int16), axis=0)).max() > 0  # Something moves.
    return frames
