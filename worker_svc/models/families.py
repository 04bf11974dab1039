"""Which decoder modules build each architecture: the Llama-family decoder (decoder.py, tensor_parallel.py) unless a
family brings its own module."""
from sluice.worker.models.decoder import DecoderLM
from sluice.worker.models.gemma import GemmaLM, TensorParallelGemmaLM
from sluice.worker.models.gpt_oss import GptOssLM, TensorParallelGptOssLM
from sluice.worker.models.qwen2_5_vl import QwenVisionLanguageLM, TensorParallelQwenVisionLanguageLM
from sluice.worker.models.tensor_parallel import TensorParallelDecoderLM

ModelClasses = tuple[type[DecoderLM], type[TensorParallelDecoderLM]]  # (the whole model, a tensor-parallel rank's)

FAMILY_MODELS: dict[str, ModelClasses] = {
    "GptOssForCausalLM": (GptOssLM, TensorParallelGptOssLM),
    "Gemma2ForCausalLM": (GemmaLM, TensorParallelGemmaLM),
    "Gemma3ForCausalLM": (GemmaLM, TensorParallelGemmaLM),
    "Qwen2_5_VLForConditionalGeneration": (QwenVisionLanguageLM, TensorParallelQwenVisionLanguageLM),
}


def model_classes(architecture: str) -> ModelClasses:
    return FAMILY_MODELS.get(architecture, (DecoderLM, TensorParallelDecoderLM))
