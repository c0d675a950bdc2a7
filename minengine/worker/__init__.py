"""The tensors' world: forward batch building, the paged KV cache tensors, the model runner, the sampler."""
