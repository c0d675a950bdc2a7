"""Model definitions (Llama family: Llama, Mistral-style, Qwen2, Qwen3) and the checkpoint loader."""
