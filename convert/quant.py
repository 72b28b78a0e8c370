"""FP8 weights through NVIDIA ModelOpt (nvidia-modelopt), imported only when --quant fp8 asks.

ModelOpt calibrates per-tensor FP8 scales on a few prompts and exports a unified HF checkpoint
(config.json with a quantization_config, scales next to the weights) that TRT-LLM's PyTorch
backend loads directly. Calibration runs the full model, so it wants the GPU(s) of the node.
"""
from __future__ import annotations

from pathlib import Path

from dynspec.errors import DynspecError

CALIBRATION_PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Speculative decoding verifies several drafted tokens in one forward pass because",
    "In 1969, the first crewed landing on the Moon",
)


def require_modelopt():
    """The ModelOpt modules --quant fp8 needs, or a DynspecError that says how to get them."""
    try:
        import modelopt.torch.quantization as mtq
        from modelopt.torch.export import export_hf_checkpoint
    except ImportError as e:
        raise DynspecError(
            f"--quant fp8 needs NVIDIA ModelOpt, which is not importable here ({e}); "
            "install it with `pip install nvidia-modelopt[torch]` or convert without --quant"
        ) from e
    return mtq, export_hf_checkpoint


def quantize_fp8(ckpt_dir: Path, out_dir: Path, device: str = "cuda") -> None:
    """Calibrate the normalized checkpoint in ckpt_dir and export FP8 weights into out_dir."""
    mtq, export_hf_checkpoint = require_modelopt()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(ckpt_dir), dtype="auto", device_map=device)
    try:
        tok = AutoTokenizer.from_pretrained(str(ckpt_dir))
        batches = [tok(p, return_tensors="pt").input_ids for p in CALIBRATION_PROMPTS]
    except (OSError, ValueError):  # no tokenizer files: calibrate on fixed token ids
        vocab = model.config.vocab_size
        batches = [torch.arange(1, 65).remainder(vocab).unsqueeze(0) + i for i in range(4)]

    def forward_loop(m):
        with torch.no_grad():
            for ids in batches:
                m(ids.to(m.device))

    mtq.quantize(model, mtq.FP8_DEFAULT_CFG, forward_loop)
    export_hf_checkpoint(model, export_dir=str(out_dir))
