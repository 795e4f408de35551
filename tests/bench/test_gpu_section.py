"""The GPU benchmark without a GPU: its arguments, its model shape, its skip, and its code path on the CPU."""

import pytest
import torch
from transformers import Qwen2ForCausalLM

from benchmarks import gpu


def test_arguments_and_their_errors(capsys):
    args = gpu.parse_args([])
    assert (args.prompts, args.samples, args.new_tokens, args.allow_cpu) == (32, 8, 256, False)
    with pytest.raises(SystemExit):
        gpu.parse_args(["--samples", "0"])
    assert "--samples must be at least 1, got 0" in capsys.readouterr().err


def test_model_has_qwen2_05b_shape():
    config = gpu.qwen2_05b_config()
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == 494_032_768  # Qwen2-0.5B, tied embeddings


def test_model_has_qwen2_15b_shape():
    config = gpu.qwen2_config("1.5b")
    assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size) == (1536, 28, 8960)
    assert (config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == (12, 2, 151936)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == 1_543_714_304  # Qwen2-1.5B, tied embeddings
    assert gpu.parse_args(["--shape", "1.5b"]).shape == "1.5b" and gpu.parse_args([]).shape == "0.5b"


def test_nominal_peak_by_device_name():
    assert gpu.nominal_peak("NVIDIA H100 80GB HBM3") == 989e12
    assert gpu.nominal_peak("NVIDIA H100 PCIe") == 756e12
    assert gpu.nominal_peak("NVIDIA L40S") == 362e12 and gpu.nominal_peak("NVIDIA L4") == 121e12
    assert gpu.nominal_peak("Some Future GPU") is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_without_gpu_it_says_so_and_succeeds(capsys):
    assert gpu.main([]) == 0
    assert capsys.readouterr().out.strip() == gpu.SKIP_MESSAGE


def test_tiny_run_on_cpu():
    args = gpu.parse_args(
        [
            "--allow-cpu",
            "--tiny",
            "--prompts",
            "2",
            "--samples",
            "2",
            "--prompt-tokens",
            "6",
            "--new-tokens",
            "3",
            "--steps",
            "1",
            "--no-write",
        ]
    )
    result = gpu.run(args, torch.device("cpu"))
    assert result["generated_tokens"] == 2 * 2 * 3  # no end token: every sample runs to its limit
    assert result["learner_model_flops"] > 0 and 0 < result["fraction_of_measured_peak"] < 1
    assert result["engine_generate_tokens_per_s"] > 0 and result["model_generate_tokens_per_s"] > 0
