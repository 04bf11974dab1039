"""--no-dependent-launch reaches the kernels: the loader hands the worker's choice to the Triton operators, which pass
it to every launcher that takes programmatic dependent launch."""
import pytest
import torch

from sluice.kernels.dependent_launch import dependent_launch
from sluice.worker.config import WorkerConfig
from sluice.worker.loading.model_loader import ModelLoader


@pytest.mark.parametrize("wanted", [True, False])
def test_the_triton_operators_take_the_workers_choice(wanted):
    loaded = ModelLoader(WorkerConfig(model="SmolLM2-tiny", load_format="dummy", kernels="triton",
                                      dependent_launch=wanted)).load()
    assert loaded.ops.pdl is wanted


def test_a_launch_not_wanted_takes_no_dependent_launch():
    assert dependent_launch(torch.device("cuda"), wanted=False) == {"PDL": False}


@pytest.mark.gpu
def test_a_launch_on_hopper_takes_it_where_wanted():
    device = torch.device("cuda")
    expected = torch.cuda.get_device_capability() >= (9, 0)
    assert dependent_launch(device)["PDL"] is expected
