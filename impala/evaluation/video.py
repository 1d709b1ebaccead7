"""Videos of games: one MP4 per game, under a temporary name until the game is over."""

from __future__ import annotations

import os

import cv2
import numpy as np

_PARTIAL_VIDEO_SUFFIX = ".incomplete.mp4"  # OpenCV picks the container by the extension.


class Video:
    """One game's MP4 (OpenCV, codec mp4v), written under a temporary name until finished."""

    def __init__(self, path: str, fps: float):
        """Args: path: the finished video's name, ending in .mp4. fps: frames per second."""
        self.path = path
        self.partial_path = path[: -len(".mp4")] + _PARTIAL_VIDEO_SUFFIX
        self._fps = fps
        self._writer: cv2.VideoWriter | None = None

    def add(self, screen: np.ndarray) -> None:
        """Appends one RGB frame, uint8 [height, width, 3]."""
        if self._writer is None:
            height, width = screen.shape[:2]
            fourcc = cv2.VideoWriter_fourcc(*"mp4v")
            self._writer = cv2.VideoWriter(self.partial_path, fourcc, self._fps, (width, height))
            if not self._writer.isOpened():
                raise ValueError(f"--video_dir: cannot write the video {self.partial_path}")
        self._writer.write(cv2.cvtColor(screen, cv2.COLOR_RGB2BGR))

    def finish(self) -> str:
        """Completes the file and gives it its final name; returns that name."""
        self._writer.release()
        os.replace(self.partial_path, self.path)
        return self.path

    def discard(self) -> None:
        """Drops an unfinished video."""
        if self._writer is not None:
            self._writer.release()
            if os.path.exists(self.partial_path):
                os.remove(self.partial_path)


def make_folder(folder: str) -> None:
    """Creates the videos' folder (and its parents), or raises a one-line ValueError."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as error:
        raise ValueError(f"--video_dir={folder}: cannot create it ({error.strerror})") from error
