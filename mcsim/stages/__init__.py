"""The stages of one sample: workload, request traces, KV cache, speculative decoding, experts, economics."""
