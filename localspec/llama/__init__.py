"""The llama.cpp boundary: one model and its KV cache, the build's CPU features, chat tokens, the sampling
chain, llama.cpp's log (``logs``), llama.cpp's own programs built from the vendored source (``programs``) and
the child processes that run them (``processes``)."""
