"""npu.engine: the CPU engine, RoPE, and the quantized block formats with the linear-layer
backends they run on."""
