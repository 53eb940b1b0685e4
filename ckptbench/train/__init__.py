"""Training: build transformers' LlamaForCausalLM on the device, apply a checkpoint plan, the training step
per precision, optimizers, offloading and FLOP counts. Must not measure, nor loop over points."""
