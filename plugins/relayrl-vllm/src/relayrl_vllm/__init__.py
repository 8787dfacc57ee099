"""relayrl-vllm: vLLM as a relayrl inference engine (``[rollout] engine = "vllm"``).

:class:`relayrl_vllm.engine.VllmEngine` streams tokens with their logprobs under the truncated
distribution actually sampled, the kept-set of every token (vLLM's own sampling masks where the
installed vLLM returns them, else relayrl's truncation in a logits processor), and the weight
version that produced each token; it takes weight updates in place. Importing this package does
not import vLLM.
"""
