"""The bundled reference deployment: real Triton (tiny_lm model repository), optional vLLM, and a gateway."""
