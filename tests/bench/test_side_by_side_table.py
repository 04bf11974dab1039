"""benchmarks/side_by_side_table.py pairs each row's Sluice reports with vLLM's result and divides them."""
import json

import pytest

from tests.scripts import ROOT, load_script


@pytest.fixture
def side_by_side_table(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # it imports record_result beside it
    return load_script(ROOT / "benchmarks" / "side_by_side_table.py")


def _write(folder, name: str, data: dict) -> None:
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(data))


def _sluice(bench: str, **result) -> dict:
    return {"workload": {"bench": bench}, "results": [{"name": "sluice", **result}]}


def test_each_row_beside_vllm_with_ratios(tmp_path, side_by_side_table):
    first, second = tmp_path / "call1", tmp_path / "call3"
    _write(first, "host_1", {"call": 1, "gpu": "NVIDIA H100 80GB HBM3", "host_loop_s": 0.15})
    _write(second, "host_3", {"call": 3, "gpu": "NVIDIA H100 80GB HBM3", "host_loop_s": 0.13})
    _write(first, "inproc_qwen-standard", _sluice("throughput", output_tokens_per_s=24000.4))
    _write(first, "grpc_qwen-standard", _sluice("throughput", output_tokens_per_s=22000.0))
    _write(second, "vllm_qwen-standard", {"output_tok_s": 20000.0})
    _write(first, "grpc_qwen-batch1", _sluice("latency", ms_per_token=2.0))
    _write(second, "vllm_qwen-batch1", {"ms_per_token": 2.5})
    table = side_by_side_table.render(*side_by_side_table.load([first, second]), "abc1234")
    header, _, _, _, throughput, batch1 = table.splitlines()
    assert header.startswith("GPU: NVIDIA H100 80GB HBM3; host loop: 0.13–0.15 s; commit abc1234;")
    assert throughput == "| qwen-standard | output tok/s | 24,000 | 22,000 | 20,000 | 1.20× | 1.10× |"
    assert batch1 == "| qwen-batch1 | ms per output token | — | 2.0 | 2.5 | — | 0.80× |"
