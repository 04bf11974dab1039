import torch


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Hugging Face transformers' greedy continuation, cut after the first EOS as the server stops there."""
    with torch.inference_mode():
        output = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False)
    return output[0, len(prompt_ids):].tolist()
