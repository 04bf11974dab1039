"""A stand-in for a pipeline stage's compute in the processes a test starts with this folder on PYTHONPATH: with
SLUICE_TEST_STAGE_SECONDS set, each stage's pass over a step takes that many seconds longer."""
import os

if os.environ.get("SLUICE_TEST_STAGE_SECONDS"):
    import time

    from sluice.worker.models.pipeline_stage import PipelineStageLM

    _seconds = float(os.environ["SLUICE_TEST_STAGE_SECONDS"])
    _hidden_states = PipelineStageLM.hidden_states

    def _slower_hidden_states(self, *args, **kwargs):
        time.sleep(_seconds)
        return _hidden_states(self, *args, **kwargs)

    PipelineStageLM.hidden_states = _slower_hidden_states
