"""Training: build the model (any supported family: LlamaForCausalLM, Qwen3ForCausalLM, ...) on the device,
apply a checkpoint plan, the training step per precision, optimizers, offloading and FLOP counts. Must not
measure, nor loop over points."""
