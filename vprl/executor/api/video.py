"""`VideoSegment` and the video routines (ViperGPT's class plus Stanić et al.'s event routines).

A video reaches a program as a `Video`: a sequence of frames, each a `SourceImage`. Frame indices
of a segment (`start`, `end`) are relative to the original video.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence

import numpy as np

from vprl.executor.api.language import select_answer as _select_answer
from vprl.executor.api.patch import ImagePatch
from vprl.executor.api.source import FrameSequence, SourceImage


class Video:
    """Frames of a video (frames first, like a (T, C, H, W) tensor)."""

    def __init__(self, frames: Sequence[SourceImage]):
        self.frames = tuple(frames)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        first = self.frames[0] if self.frames else SourceImage("", 0, 0)
        return (len(self.frames), 3, first.height, first.width)

    def __len__(self) -> int:
        return len(self.frames)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return Video(self.frames[index])
        return self.frames[index]


class VideoSegment(FrameSequence):
    """A contiguous range of frames of a video, with methods that look at it.

    Attributes
    ----------
    video : the frames of the segment
    start, end : int
        First frame and one past the last frame, relative to the original video.
    num_frames : int

    Methods
    -------
    frame_from_index(index: int) -> ImagePatch
    frame_iterator() -> Iterator[ImagePatch]
    trim(start: int = None, end: int = None) -> VideoSegment
    simple_query(question: str) -> str
    caption_video(question: str) -> str
    get_video_segment_of_event(event: str) -> VideoSegment
    get_video_segment_before_event(event: str) -> VideoSegment
    get_video_segment_after_event(event: str) -> VideoSegment
    select_answer(info: dict, question: str, options: list[str]) -> str
    """

    def __init__(self, video, start: int = None, end: int = None, parent_start: int = 0, queues=None):
        """A segment of `video`; with no start/end it is the whole video.

        >>> video_segment = VideoSegment(video)
        """
        if not isinstance(video, Video):
            video = Video(list(video))
        if start is None and end is None:
            self.trimmed_video, start, end = video, 0, len(video)
        else:
            start = 0 if start is None else start
            end = len(video) if end is None else end
            self.trimmed_video = video[start:end]
        self.video = self.trimmed_video
        self.start = start + parent_start
        self.end = end + parent_start
        self.num_frames = len(self.trimmed_video)

    def frame(self, index: int) -> SourceImage:
        if not -self.num_frames <= index < self.num_frames:
            raise IndexError(f"frame {index} is outside the segment's {self.num_frames} frames")
        return self.trimmed_video[index]

    def frame_from_index(self, index: int) -> ImagePatch:
        """The frame at position `index` of the segment as an ImagePatch (negative indices count
        from the end).

        >>> # what is in the middle of the video?
        >>> middle = video_segment.frame_from_index(video_segment.num_frames // 2)
        >>> return middle.simple_query("What is in the frame?")
        """
        return ImagePatch(self.frame(operator.index(index)))

    def frame_iterator(self) -> Iterator[ImagePatch]:
        """Each frame of the segment as an ImagePatch, in order.

        >>> # does a dog appear?
        >>> for frame in video_segment.frame_iterator():
        >>>     if frame.exists("dog"):
        >>>         return "yes"
        """
        for i in range(self.num_frames):
            yield self.frame_from_index(i)

    def trim(self, start: int = None, end: int = None) -> VideoSegment:
        """A sub-segment; `start` and `end` are frame numbers within this segment.

        >>> # the second half of the video
        >>> second_half = video_segment.trim(video_segment.num_frames // 2, video_segment.num_frames)
        """
        start = 0 if start is None else max(int(start), 0)
        end = self.num_frames if end is None else min(int(end), self.num_frames)
        return VideoSegment(self.trimmed_video, start, end, self.start)

    def _middle(self) -> ImagePatch:
        if self.num_frames == 0:
            raise ValueError("the video segment has no frames")
        return ImagePatch(self.frame(self.num_frames // 2))

    def simple_query(self, question: str) -> str:
        """Answer a simple question about the segment (asked of its middle frame)."""
        return self._middle().simple_query(question)

    def caption_video(self, question: str) -> str:
        """Describe what happens in the segment, focusing on `question` (answers it on up to
        three evenly spaced frames).

        >>> after = video_segment.get_video_segment_after_event("the man opens the door")
        >>> info = after.caption_video("What does the man do?")
        """
        if self.num_frames == 0:
            raise ValueError("the video segment has no frames")
        picks = sorted({int(i) for i in np.linspace(0, self.num_frames - 1, num=min(3, self.num_frames))})
        answers = [ImagePatch(self.frame(i)).simple_query(question) for i in picks]
        return "; ".join(f"frame {self.start + i}: {a}" for i, a in zip(picks, answers))

    def _event_span(self, event: str) -> tuple[int, int]:
        # Localise the event as the longest run of frames scoring above the segment's mean match
        # (ExoViP's recipe for AGQA, with image-text matching in place of captions).
        if self.num_frames == 0:
            raise ValueError("the video segment has no frames")
        scores = np.array([ImagePatch(f)._tool("itm", texts=[event])[0] for f in self.trimmed_video.frames])
        above = scores >= scores.mean()
        best, run_start, span = (0, 0), None, (0, 1)
        for i, flag in enumerate([*above, False]):
            if flag and run_start is None:
                run_start = i
            elif not flag and run_start is not None:
                if i - run_start > best[1] - best[0]:
                    best = (run_start, i)
                run_start = None
        span = best if best[1] > best[0] else span
        return span

    def get_video_segment_of_event(self, event: str) -> VideoSegment:
        """The part of the segment where `event` happens."""
        start, end = self._event_span(event)
        return self.trim(start, end)

    def get_video_segment_before_event(self, event: str) -> VideoSegment:
        """The part of the segment before `event` happens."""
        start, _ = self._event_span(event)
        return self.trim(0, max(start, 1))

    def get_video_segment_after_event(self, event: str) -> VideoSegment:
        """The part of the segment after `event` happens."""
        _, end = self._event_span(event)
        return self.trim(min(end, self.num_frames - 1), self.num_frames)

    def select_answer(self, info: dict, question: str, options: list[str]) -> str:
        """Pick the best of `options` for `question` given the facts in `info`."""
        return _select_answer(info, question, options)

    def __repr__(self) -> str:
        return f"VideoSegment({self.start}, {self.end})"
