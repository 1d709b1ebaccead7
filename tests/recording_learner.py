"""The real learner process, recording what it trains on, for tests that check its actors.

    python -m tests.recording_learner RECORD.pkl <experiment.py learner flags>

Runs `experiment.py`'s learner role unchanged (its loop, trainer, service and checkpoints), with
the service class wrapped so that every batch the loop dequeues and every weight version it
publishes are also kept. At exit it writes them to RECORD.pkl:
  published: {version: [variable values]}, the weights actors could fetch as that version;
  batches: [(version published when the batch was dequeued, actor_task, weight_version,
             steps as numpy arrays)].
"""

import pickle
import sys
from typing import ClassVar

import experiment
from impala import transport


class RecordingLearnerService(transport.LearnerService):
    published: ClassVar[dict] = {}
    batches: ClassVar[list] = []
    latest = 0

    def publish_weights(self, version: int) -> None:
        super().publish_weights(version)
        RecordingLearnerService.published[version] = [v.numpy() for v in self._variables]
        RecordingLearnerService.latest = version

    def dequeue(self, batch_size: int) -> transport.QueuedTrajectories:
        queued = super().dequeue(batch_size)
        steps = type(queued.steps)(*(t.numpy() for t in queued.steps))
        RecordingLearnerService.batches.append(
            (
                RecordingLearnerService.latest,
                queued.actor_task.numpy(),
                queued.weight_version.numpy(),
                steps,
            )
        )
        return queued


def main() -> None:
    record_path = sys.argv.pop(1)
    transport.LearnerService = RecordingLearnerService
    try:
        experiment.app.run(experiment.main)
    finally:
        with open(record_path, "wb") as f:
            pickle.dump(
                {
                    "published": RecordingLearnerService.published,
                    "batches": RecordingLearnerService.batches,
                },
                f,
            )


if __name__ == "__main__":
    main()
