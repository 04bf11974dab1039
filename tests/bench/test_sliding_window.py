"""benchmarks/sliding_window.py --tiny on the CPU: full attention holds every prompt's whole KV at once, the window's
run a fraction of it, and the attention of each layer kind is timed once per layer and step."""
import json

from tests.scripts import ROOT, load_script


def test_tiny_run(tmp_path):
    benchmark = load_script(ROOT / "benchmarks" / "sliding_window.py")
    assert benchmark.main([str(tmp_path / "window.json"), "--tiny"]) == 0
    result = json.loads((tmp_path / "window.json").read_text())
    window, full = result["memory"]["window"], result["memory"]["full"]
    assert window["attention_window"] == 32 and full["attention_window"] == 0
    assert window["preemptions"] == full["preemptions"] == 0
    assert full["peak_blocks"] >= 8 * -(-216 // 16)  # 8 prompts of 216 tokens, 16 tokens a block
    assert window["peak_blocks"] < full["peak_blocks"] / 2
    assert window["all_running_blocks"] <= 8 * 3  # a window of 32 tokens and the next token's slot: 3 blocks at most
    layers = {"tiny Gemma-3": (5, 1), "tiny gpt-oss": (1, 1)}
    for row in result["attention_share"]:
        assert (row["sliding_ranges_per_step"], row["global_ranges_per_step"]) == layers[row["model"]]
        assert 0 < row["sliding_share"] < 1 and 0 < row["global_share"] < 1
