"""Real model servers on this machine: llama.cpp (llama-cpp-python's OpenAI-compatible server)
serving a small GGUF model on the CPU, for ``inferlb demo --model-server llamacpp``, the
real-engine tests (tests/integration/test_real_engine.py) and benchmarks/real_engine.py."""
