"""CPU stand-ins for hardware this machine lacks: the TPU compile gate, the NKI simulator,
the GpSimd host shim, and compiler-schedule cost estimates."""
